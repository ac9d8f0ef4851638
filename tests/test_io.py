"""One writer per folder (poolsim.io.folder_lock) and the per-user cache folder (poolsim.io.cache_dir)."""
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
    with poolsim.io.folder_lock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(600)
""")


@pytest.fixture
def holder(tmp_path):
    """A live process holding ``tmp_path``'s lock; killed and reaped after the test."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.mark.slow
def test_second_writer_is_refused_naming_the_holder(tmp_path, holder):
    with pytest.raises(poolsim.io.FolderBusyError) as err:
        with poolsim.io.folder_lock(tmp_path):
            pass
    assert err.value.holder == f"pid {holder.pid} on {socket.gethostname()}"
    assert f"pid {holder.pid}" in str(err.value) and "--wait" in str(err.value)


@pytest.mark.slow
def test_a_killed_holder_leaves_no_stale_lock(tmp_path, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / ".lock").read_text().startswith(f"pid {holder.pid}")  # the dead holder's file is still there
    with poolsim.io.folder_lock(tmp_path):
        assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()} ")


@pytest.mark.slow
def test_wait_blocks_until_the_holder_is_done(tmp_path, holder):
    killer = subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep(1.0); os.kill({holder.pid}, 9)"])
    try:
        t0 = time.monotonic()
        with poolsim.io.folder_lock(tmp_path, wait=True):
            waited = time.monotonic() - t0
            assert holder.wait(timeout=5) == -signal.SIGKILL  # the lock came only once the holder was dead
        assert waited > 0.5
    finally:
        killer.wait()


def test_release_lets_the_next_writer_in_and_clears_the_holder(tmp_path):
    with poolsim.io.folder_lock(tmp_path):
        with pytest.raises(poolsim.io.FolderBusyError):  # a second lock in the same process is refused too
            with poolsim.io.folder_lock(tmp_path):
                pass
    assert (tmp_path / ".lock").read_text() == ""


def test_a_folder_the_lock_created_goes_if_nothing_was_written(tmp_path):
    with poolsim.io.folder_lock(tmp_path / "new" / "sub"):  # creates the folder
        assert (tmp_path / "new" / "sub" / ".lock").exists()
    assert not (tmp_path / "new" / "sub").exists() and (tmp_path / "new").is_dir()
    with poolsim.io.folder_lock(tmp_path / "kept"):
        (tmp_path / "kept" / "result.csv").write_text("x\n")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [".lock", "result.csv"]


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("POOLSIM_CACHE_DIR", str(tmp_path))
    assert poolsim.io.cache_dir("jax") == tmp_path / "jax"
    for off in ("0", "off", "OFF", "none", "false", "no"):
        monkeypatch.setenv("POOLSIM_CACHE_DIR", off)
        assert poolsim.io.cache_dir("jax") is None
    monkeypatch.delenv("POOLSIM_CACHE_DIR")
    import platformdirs

    assert poolsim.io.cache_dir("torch-inductor") == (
        __import__("pathlib").Path(platformdirs.user_cache_dir("poolsim", appauthor=False)) / "torch-inductor")
    for bad in ("", "a/b", "..", 3):
        with pytest.raises(ValueError, match="kind"):
            poolsim.io.cache_dir(bad)


@pytest.mark.parametrize("name", ["FolderBusyError", "folder_lock", "atomic_write", "atomic_write_text", "cache_dir"])
def test_old_top_level_names_still_work_with_a_deprecation_warning(name):
    import poolsim.io

    with pytest.warns(DeprecationWarning, match=rf"poolsim\.{name} moved to poolsim\.io\.{name}"):
        value = getattr(poolsim, name)
    assert value is getattr(poolsim.io, name)
    assert name not in poolsim.__all__ and name in poolsim.io.__all__


def test_the_top_level_opens_with_the_science():
    # the plumbing is one submodule at the end; the strategies come first
    assert poolsim.__all__[:3] == ["naive_pool", "subsample", "match"]
    assert poolsim.__all__[-1] == "io"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        poolsim.nothing
