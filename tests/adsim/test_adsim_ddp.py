"""Data-parallel adsim (torchrun + DDP, gloo on CPU) against one process, the frozen-trunk cache, and the
bad-input lines of issue 14.

The reference of every comparison is an independent one-process run of the same configuration (same
global batch): the two runs share no state. Tolerances: the data-parallel step computes the same float32
numbers in another summation order (all-gathered features, DDP's averaged gradients), so results agree
to a few hundred float32 ulps, not bitwise: ``rtol = 1e-5``, ``atol = 1e-6`` (measured: largest head
difference 6e-8, loss difference 1.3e-6 on a loss of 12.5 after two epochs).
"""
import copy
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from adsim.cli.main import main
from adsim.runtime import distributed

pytestmark = [pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning"), pytest.mark.slow]  # slow: torchrun process groups, ~2 min
ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-6


def _common(data, out):
    # 3 training domains x 2 splits x 4 images = 24 images; global batch 8 -> 3 steps per epoch
    return ["train", "--data", str(data), "--target", "Liver", "--train-domains", "Chest", "Histopathology",
            "Brain", "--backbone", "tiny", "--batch-size", "8", "--no-progress", "--out", str(out)]


def _torchrun(args, nproc=2, timeout=240, **popen):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--standalone", "-m", "adsim", *args]
    if popen:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, **popen)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _history(run):
    return json.loads((Path(run) / "history.json").read_text())


def _head(run):
    return torch.load(Path(run) / "checkpoint_last.pt", weights_only=False)["head"]


def _children(pid):
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # field 4 of /proc/PID/stat: the parent's pid
            kids.append(int(stat.parent.name))
    return kids


def _rank_pid(agent_pid, rank):
    for pid in _children(agent_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


def _hit_rank_1(args, run, sig):
    """Start ``args`` under torchrun, wait until epoch 0 is checkpointed, send ``sig`` to rank 1.
    SIGKILL: a rank dies. SIGSTOP: a rank stalls with its sockets open, so only the collective timeout
    can end rank 0's wait; rank 0 must say so, then the stalled rank is killed. Returns
    ``(returncode, output, seconds from the signal to the end of the job)``."""
    proc = _torchrun(args, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (run / "history.json").exists():  # training under way on both ranks
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.05)
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        t0 = time.monotonic()
        os.kill(victim, sig)
        lines = []
        if sig == signal.SIGSTOP:
            for line in proc.stdout:
                lines.append(line)
                if "distributed training failed" in line:
                    break
            else:
                pytest.fail("no timeout message:\n" + "".join(lines))
            os.kill(victim, signal.SIGKILL)
        rc = proc.wait(timeout=120)
        return rc, "".join(lines) + proc.stdout.read(), time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()


def test_two_ranks_killed_resumed_equal_one_process(toy_root, tmp_path):
    """2 ranks (gloo): a killed rank fails the job; ``--resume`` under torchrun finishes it; the result
    (per-epoch losses, selection AUCs scored sharded + gathered, head state with centroids and VACA
    statistics, final metrics) equals an independent one-process run with the same global batch."""
    one, two = tmp_path / "one", tmp_path / "two"
    extra = ["--select-heldout", "0.5"]  # 12 training images: steps of 8 and 4 images (uneven last batch)
    rc, out, seconds = _hit_rank_1([*_common(toy_root, two), "--epochs", "1000", "--dist-timeout", "5", *extra],
                                   two, signal.SIGKILL)
    assert rc != 0 and seconds < 60, out
    assert "ChildFailedError" in out or "distributed training failed" in out, out
    epochs = torch.load(two / "checkpoint_last.pt", weights_only=False)["epoch"] + 2  # one more epoch to do
    r = _torchrun([*_common(toy_root, two), "--epochs", str(epochs), "--resume", "--dist-timeout", "60", *extra])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("run written to") == 1  # rank 0 reports, rank 1 is silent
    assert main([*_common(toy_root, one), "--epochs", str(epochs), *extra]) == 0
    # the run folder says how many processes trained it (the latest (re)start)
    executions = [json.loads((run / "config.json").read_text())["execution"] for run in (one, two)]
    assert [e["world_size"] for e in executions] == [1, 2] and {e["device_name"] for e in executions} == {"cpu"}
    h1, h2 = _history(one), _history(two)
    assert [e["epoch"] for e in h2["history"]] == list(range(epochs)) and h1["best"] == pytest.approx(h2["best"])
    for e1, e2 in zip(h1["history"], h2["history"]):
        assert e1["steps"] == e2["steps"] == 2
        for k in e1:
            assert e2[k] == pytest.approx(e1[k], rel=RTOL, abs=ATOL), k
    a, b = _head(one), _head(two)
    for k in a:  # adapters, VACA MLPs and running statistics, centroids
        torch.testing.assert_close(b[k], a[k], rtol=RTOL, atol=ATOL, msg=k)
    assert a["centroids.init_pos"].sum() > 0  # the matching state is part of what is compared
    assert main(["eval", "--run", str(one), "--data", str(toy_root), "--no-progress"]) == 0
    assert main(["eval", "--run", str(two), "--data", str(toy_root), "--no-progress"]) == 0
    m1, m2 = (json.loads((run / "metrics.json").read_text()) for run in (one, two))
    assert m2["image_auc"] == m1["image_auc"]  # 4 test images: no score within 1e-6 of another
    # pixel AUC over ~16k pixels: a head perturbed by ~1e-7 reorders only near-tied pixel pairs, each
    # worth 100 / (n_pos n_neg) percent; 1e-3 percentage points allows a few hundred such swaps
    assert m2["pixel_auc"] == pytest.approx(m1["pixel_auc"], abs=1e-3)


def test_stalled_rank_times_out_with_one_line(toy_root, tmp_path):
    run = tmp_path / "run"
    rc, out, seconds = _hit_rank_1([*_common(toy_root, run), "--epochs", "1000", "--dist-timeout", "3"],
                                   run, signal.SIGSTOP)
    line = next(x for x in out.splitlines() if "distributed training failed" in x)
    assert line.startswith("error: rank 0 of 2:") and "--dist-timeout 3 s" in line
    assert rc != 0 and seconds < 60


def test_sampler_shards_interleave_to_the_one_process_batches():
    """DistributedSampler shards of the ranks, batched per rank and put in one-process order by
    ``one_process_order``, are exactly the one-process batches -- the last, shorter batch too."""
    data = list(range(23))
    for size, local in ((2, 3), (3, 2), (4, 1)):
        one = [b.tolist() for b in torch.utils.data.DataLoader(
            data, batch_size=size * local, sampler=distributed.sampler(data, 7, 3, distributed.World(0, 1, 0)))]
        ranks = [list(torch.utils.data.DataLoader(data, batch_size=local, sampler=distributed.sampler(data, 7, 3, distributed.World(r, size, r))))
                 for r in range(size)]
        merged = [distributed.one_process_order(torch.cat(step), size).tolist() for step in zip(*ranks)]
        kept = len(data) - len(data) % size  # drop_last: the last len % size of the permutation are skipped
        assert sum(merged, []) == sum(one, [])[:kept]
        assert [len(b) for b in merged[:-1]] == [size * local] * (len(merged) - 1)
    # with one process the permutation is the one the trainer used before data parallelism
    gen = torch.Generator().manual_seed(7 + 3)
    assert list(distributed.sampler(data, 7, 3, distributed.World(0, 1, 0))) == torch.randperm(23, generator=gen).tolist()


def test_trunk_cache_gives_identical_training(toy_root, tmp_path):
    plain, cached = tmp_path / "plain", tmp_path / "cached"
    assert main([*_common(toy_root, plain), "--epochs", "2"]) == 0
    assert main([*_common(toy_root, cached), "--epochs", "2", "--trunk-cache"]) == 0
    assert _history(plain) == _history(cached)
    a, b = _head(plain), _head(cached)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


def test_bad_input_world_size_and_cuda(toy_root, tmp_path, capsys):
    with pytest.raises(ValueError, match="divisible by the torchrun world size 4"):
        distributed.local_batch_size(10, distributed.World(0, 4, 0))
    assert distributed.local_batch_size(12, distributed.World(1, 4, 1)) == 3
    with pytest.raises(ValueError, match="timeout"):
        distributed.setup("cpu", timeout_s=0)
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the no-CUDA error cannot be provoked")
    assert main([*_common(toy_root, tmp_path / "r"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: device 'cuda' requested but CUDA is not available"]


@pytest.mark.parametrize("n, size", [(7, 3), (2, 3), (4, 2)])
def test_sharded_scores_are_reassembled_in_order(monkeypatch, n, size):
    """``shard`` + ``gather_arrays`` (evaluation) put every item back at its place, also when some ranks
    have no item at all (n < size). The collective is replaced by the list it would deliver."""
    items = list(range(n))
    shares = []
    for r in range(size):
        monkeypatch.setattr(distributed, "world", lambda r=r: distributed.World(r, size, r))
        shares.append(distributed.shard(items))
    assert sorted(sum(shares, [])) == items  # every item scored exactly once
    outs = [{"scores": np.array(s, dtype=float) * 10, "maps": None} if s else None for s in shares]
    monkeypatch.setattr(distributed.dist, "all_gather_object", lambda parts, obj: parts.__setitem__(slice(None), outs))
    full = distributed.gather_arrays(outs[-1], n)  # the last rank, whose share may be empty
    assert full["maps"] is None and full["scores"].tolist() == [10.0 * i for i in items]


def test_gathering_no_item_on_one_process_is_a_clear_error():
    """One process holds every item, so an empty share means there are none: a ValueError naming it,
    not ``None`` in place of the dict of arrays."""
    assert distributed.world().size == 1
    with pytest.raises(ValueError, match=r"no items to gather \(n = 0\)"):
        distributed.gather_arrays(None, 0)


class _FakeDetector:
    """Scores sample ``i`` as ``i``-dependent noise (fixed seed), maps (8, 8); batches of 2."""

    def score_samples(self, samples, *, batch_size, maps, progress, desc):
        from types import SimpleNamespace
        for j in range(0, len(samples), 2):
            part = samples[j:j + 2]
            rng = [np.random.default_rng(s) for s in part]
            yield (SimpleNamespace(scores=np.array([r.normal() for r in rng]),
                                   maps=np.stack([r.normal(size=(8, 8)) for r in rng])),
                   {"label": torch.tensor([s % 2 for s in part]),
                    "mask": torch.stack([torch.from_numpy(np.eye(8)) * (s % 2) for s in part])})


@pytest.mark.parametrize("size", [2, 3])
def test_eval_metrics_merge_the_ranks_accumulators(monkeypatch, size):
    """Evaluation under torchrun: each rank streams its shard into an Accumulator, the accumulators are
    merged and the image scores come back in sample order; the result equals one process (oracle: the
    same function with world size 1). The collectives are replaced by the lists they would deliver."""
    E = importlib.import_module("adsim.evaluation.evaluate")  # the module (adsim.evaluation.evaluate is also a function)
    from adsim.evaluation.evaluate import split_metrics
    from adsim.metrics.accumulator import Accumulator
    samples = list(range(9))
    kw = dict(batch_size=2, pixel=True, progress=False, desc="", smooth_sigma=0.0)
    ref, ref_scores = split_metrics(_FakeDetector(), samples, **kw)
    sent = {r: [] for r in range(size)}  # what each rank hands to each collective, in call order

    for r in range(size):  # each rank's share, with the collectives recording what they are handed
        with monkeypatch.context() as m:
            m.setattr(distributed, "world", lambda r=r: distributed.World(r, size, r))
            m.setattr(distributed, "gather_arrays", lambda out, n, r=r: (sent[r].append(copy.deepcopy(out)),
                                                                 {"scores": None})[1])
            m.setattr(distributed, "gather_objects", lambda obj, r=r: (sent[r].append(copy.deepcopy(obj)), [obj])[1])
            m.setattr(Accumulator, "compute", lambda self: {})  # one rank's share may hold one class only
            m.setattr(E, "entries", lambda *a: {})
            split_metrics(_FakeDetector(), samples, **kw)
    call = iter(range(len(sent[0])))

    def replay(parts, obj):
        i = next(call)
        parts[:] = [sent[q][i] for q in range(size)]

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(0, size, 0))
    monkeypatch.setattr(distributed.dist, "all_gather_object", replay)
    got, scores = split_metrics(_FakeDetector(), samples, **kw)
    np.testing.assert_array_equal(scores, ref_scores)
    for k in ("image_auc", "image_ap", "image_f1max"):  # exact on the same scores, in another order
        assert got[k] == pytest.approx(ref[k], abs=1e-9), k
    for k in ("pixel_auc", "pixel_ap", "pixel_f1max", "aupro"):  # binned: within both recorded bounds
        bound = got["pixel_error_bounds"][k] + ref["pixel_error_bounds"][k]
        assert got[k] == pytest.approx(ref[k], abs=bound + 1e-9), k
    assert got["n_regions"] == ref["n_regions"]
