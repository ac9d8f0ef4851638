"""One writer per folder (poolsim.folder_lock) and the per-user cache folder (poolsim.cache_dir)."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import poolsim

# A child process that takes the lock on argv[1], says so on stdout, then sleeps until killed.
_HOLDER = textwrap.dedent("""
    import sys, time, poolsim
    with poolsim.folder_lock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(600)
""")


def _start_holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    proc = _start_holder(tmp_path)
    try:
        with pytest.raises(poolsim.FolderBusyError) as err:
            with poolsim.folder_lock(tmp_path):
                pass
        assert err.value.holder == f"pid {proc.pid} on {socket.gethostname()}"
        assert f"pid {proc.pid}" in str(err.value) and "--wait" in str(err.value)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    proc = _start_holder(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert (tmp_path / ".lock").read_text().startswith(f"pid {proc.pid}")  # the dead holder's file is still there
    with poolsim.folder_lock(tmp_path):
        assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()} ")


def test_wait_blocks_until_the_holder_is_done(tmp_path):
    proc = _start_holder(tmp_path)
    killer = subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep(1.0); os.kill({proc.pid}, 9)"])
    try:
        t0 = time.monotonic()
        with poolsim.folder_lock(tmp_path, wait=True):
            waited = time.monotonic() - t0
        assert proc.poll() is not None  # the lock came only after the holder died
        assert waited > 0.5
    finally:
        killer.wait()
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_release_lets_the_next_writer_in_and_clears_the_holder(tmp_path):
    with poolsim.folder_lock(tmp_path):
        with pytest.raises(poolsim.FolderBusyError):  # a second lock in the same process is refused too
            with poolsim.folder_lock(tmp_path):
                pass
    assert (tmp_path / ".lock").read_text() == ""
    with poolsim.folder_lock(tmp_path / "new" / "sub"):  # creates the folder
        pass


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("POOLSIM_CACHE_DIR", str(tmp_path))
    assert poolsim.cache_dir("jax") == tmp_path / "jax"
    for off in ("0", "off", "OFF", "none", "false", "no"):
        monkeypatch.setenv("POOLSIM_CACHE_DIR", off)
        assert poolsim.cache_dir("jax") is None
    monkeypatch.delenv("POOLSIM_CACHE_DIR")
    import platformdirs

    assert poolsim.cache_dir("torch-inductor") == (
        __import__("pathlib").Path(platformdirs.user_cache_dir("poolsim", appauthor=False)) / "torch-inductor")
    for bad in ("", "a/b", "..", 3):
        with pytest.raises(ValueError, match="kind"):
            poolsim.cache_dir(bad)
