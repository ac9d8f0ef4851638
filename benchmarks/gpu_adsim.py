"""GPU benchmark of the adsim detector (issue 7, item 7). Not part of the tests.

Random weights, synthetic images, ``ViT-L-14-336`` at 238 px (the 17 x 17 patch grid of the authors'
240 px set-up), batch 16, bf16 autocast. Measures images/s for

1. the frozen encoder forward alone (no grad),
2. a bare adapter training step (adapters + a trivial loss, Adam),
3. a naive-pooling training step (Dice + Focal + BCE, no VACA, no centroids: the MVFA-like baseline),
4. a matching + VACA training step (batched gate, full objective),
5. a matching + VACA training step with the exact fast sequential gate (issue 12, ``gate_mode="sequential"``;
   on CUDA its decisions come from the fused Triton kernel, ``adsim.model.gate_triton``),

and the time of the batched gate, the exact fast sequential gate (``match_sequential``: one layer, and
all 8 slots of a step, with the JAX scan and with the Triton kernels -- ``chords`` at 4 (its default),
2 and 8 warps, ``dots`` at 1 (its default), 2 and 4; the issue-12 target line takes the fastest and
names it; the Triton rows are skipped, with that label, on the CPU) and the literal sequential loop on
one batch's patch features.

Compiled rows (``adsim.training.compiled_step``: what ``train`` runs by default on CUDA): the bare, naive,
matching+VACA (batched gate) and matching+VACA (exact sequential gate, EMA: its Triton kernel inside the
graph as ``torch.ops.adsim.gate_decisions``) steps with everything after the frozen trunk under ``torch.compile`` (``--compile-mode``,
default ``reduce-overhead`` = inductor + CUDA graphs), each with the time of its first two calls
(compilation + steps), and the 8 batched gates compiled alone. A step whose compilation fails (the
training step would fall back to eager with a warning) is a FAILED row, and the benchmark goes on. The
default mode's targets compare the compiled steps with each other (matching+VACA vs naive and bare). The count of CUDA-graph
skips is printed (0 = every compiled region ran as a CUDA graph; the reason is logged otherwise).
``--compile-steps`` picks which steps compile (each compilation of the ViT-L region, forward and
backward, is expected to take about a minute -- not yet measured); ``--compile-steps`` with no value
skips them. Prints a table,
checks the targets of the issue (reported, never asserted) and appends the table to
``benchmarks/RESULTS.md`` with the GPU name. Without CUDA it refuses, unless ``--device cpu --tiny``
(a smoke run of the same code path on the tiny backbone; its numbers mean nothing).

    python benchmarks/gpu_adsim.py                  # on a GPU machine, <= 5 minutes eager + the compiled rows
    python benchmarks/gpu_adsim.py --warmup 2 --iters 6 --skip-literal --batch-sizes 16 --sweep
                                                    # B=16 only: eager and compiled steps, gates
    python benchmarks/gpu_adsim.py --device cpu --tiny --results /tmp/smoke.md

In the CPU smoke run the compiled rows use the ``aot_eager`` backend by default (graph capture and
AOTAutograd, no code generation: inductor's C++ compilation takes minutes per step on a small CPU) and
say so in their labels; ``--compile-backend inductor`` compiles them for real.
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from montecarlo import append_table  # noqa: E402  (benchmarks/, the script's folder)

from adsim.config.prompts import prompt_ensemble  # noqa: E402
from adsim.config.run import TrainConfig  # noqa: E402
from adsim.methods.baselines import bilora  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone, frozen_tokens  # noqa: E402
from adsim.model.head import features, make_head, text_embeddings, trunk_tokens  # noqa: E402
from adsim.model.matching import CentroidBank, match, match_sequential  # noqa: E402
from adsim.model.objective import objective  # noqa: E402
from adsim.training import compiled_step  # noqa: E402


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, *, warmup: int, iters: int) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _batch(spec, b, device, gen):
    images = torch.randn(b, 3, spec.image_size, spec.image_size, generator=gen).to(device)
    masks = torch.zeros(b, spec.image_size, spec.image_size)
    s = spec.image_size
    masks[1::2, s // 4: s // 2, s // 4: s // 2] = 1.0  # every other image anomalous with a lesion
    labels = torch.tensor([float(i % 2) for i in range(b)])
    return {"image": images, "mask": masks.to(device), "has_mask": torch.ones(b, device=device),
            "label": labels.to(device)}


def _bare_loss(cfg, head, feats, batch):
    """The bare adapter step's trivial loss (``loss_fn`` signature of adsim.training.train.train_epoch)."""
    return torch.stack(feats.seg_logits).float().pow(2).mean() + feats.image_logits.float().pow(2).mean(), {}


def _step_fn(backbone, cfg, text, batch, device, amp, kind, compiled=None, bilora_domains=0):
    """One training step of ``kind`` ("bare" or "full"); ``compiled=(mode, backend)``: everything after
    the frozen trunk through ``adsim.training.compiled_step.compiled_loss`` (what ``train --compile`` runs).
    ``bilora_domains=k``: the naive head with BiLoRA updates (adsim.methods.baselines.bilora), the step
    training the k-th domain's cores with the k - 1 earlier ones frozen (the protocol's last step at k = 5)."""
    head = make_head(cfg, backbone.spec.width, backbone.spec.embed_dim, text).to(device)
    if bilora_domains:
        bilora.attach(head)
        for t in range(bilora_domains):
            bilora.add_domain(head, t, seed=0)
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas)
    if compiled is not None:
        post = compiled_step.compiled_loss(cfg, head, backbone, backbone.spec.grid, amp, mode=compiled[0],
                                      backend=compiled[1], loss_fn=_bare_loss if kind == "bare" else None)

    def step():
        if compiled is not None and post.regions.fell_back:
            raise RuntimeError("the compiled step fell back to eager (the warning above names the compiler error)")
        if compiled is not None:
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                tokens = trunk_tokens(backbone, batch["image"])
            loss, _ = post(cfg, head, tokens, batch)
        else:
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                feats = features(backbone, head, batch["image"])
            if kind == "bare":
                loss, _ = _bare_loss(cfg, head, feats, batch)
            else:
                loss, _ = objective(cfg, head, feats, batch, backbone.spec.grid)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
    return step


_COMPILED = {"bare": ("bare adapter step", dict(method="naive", vaca=False), "bare"),
             "naive": ("naive-pooling step", dict(method="naive", vaca=False), "full"),
             "match": ("matching+VACA step, batched gate", dict(method="match", vaca=True, gate_mode="batched"),
                       "full"),
             "exact": ("matching+VACA step, exact sequential gate (in the graph: torch.ops.adsim.gate_decisions)",
                       dict(method="match", vaca=True, gate_mode="sequential"), "full")}


def _compiled_steps(args, backbone, base, text, batch, device, amp, add, kw) -> dict:
    """Rows for the compiled steps of ``args.compile_steps`` at ``args.batch_size``: compile + first call,
    then the timed median. Returns ``{kind: seconds per step}``."""
    b, times = args.batch_size, {}
    for kind in args.compile_steps:
        label, over, loss = _COMPILED[kind]
        torch._dynamo.reset()  # each step kind compiles on its own (no recompile limit across rows)
        step = _step_fn(backbone, base._replace(**over), text, batch, device, amp, loss,
                        compiled=(args.compile_mode, args.compile_backend))
        t0 = time.perf_counter()
        try:  # compilation (+ CUDA graph recording under reduce-overhead) and one step
            with warnings.catch_warnings():
                warnings.simplefilter("always", compiled_step.CompileFallbackWarning)
                step()
            step()  # raises if the first call fell back to eager
        except RuntimeError as err:  # a compiler failure is a row (and a failed target), not the end of the run
            add(f"{label}, compiled {args.compile_label}: FAILED ({str(err).splitlines()[0][:200]})", float("nan"))
            continue
        _sync(device)
        add(f"{label}, compiled {args.compile_label}: compile + first 2 calls (B={b})", time.perf_counter() - t0)
        times[kind] = _time(step, device, **kw)
        add(f"{label}, compiled {args.compile_label} (B={b})", times[kind], b)
    return times


def _compiled_gates(args, bank, slots, device, kw) -> float:
    """The 8 batched gates of a step (``slots``: ``[(start, f, y, valid)]``) compiled alone (forward and
    centroid update, like the eager gates row); inputs at fixed addresses so CUDA graphs copy nothing."""
    for t in (x for sl in slots for x in sl[1:]):
        torch._dynamo.mark_static_address(t)

    def gates():
        for start, f, y, v in slots:
            bank.step(start, f, y, v, unit=True)
    torch._dynamo.reset()
    fn = torch.compile(gates, backend=args.compile_backend,
                       mode=None if args.compile_mode == "default" else args.compile_mode)

    def call():
        if args.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with warnings.catch_warnings():  # array_api_compat's lru_cache (see adsim.training.compiled_step)
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
            fn()
    return _time(call, device, **kw)


def _triton_variant(call, kernel: str, num_warps: int):
    """``call`` with ``match_sequential``'s Triton kernel (``adsim.model.gate_triton.gate_decisions``, looked up
    at call time) fixed to ``kernel`` at ``num_warps``; the module's function is restored after each call."""
    from adsim.model import gate_triton as _gate_triton

    gate = _gate_triton.gate_decisions
    variant = partial(gate, kernel=kernel, num_warps=num_warps)

    def timed():
        _gate_triton.gate_decisions = variant
        try:
            call()
        finally:
            _gate_triton.gate_decisions = gate
    return timed


def run(args) -> str:
    device = torch.device(args.device)
    amp = torch.bfloat16 if device.type == "cuda" else None
    name = "tiny" if args.tiny else args.backbone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)  # random weights by design: timing only
        backbone = build_backbone(name, image_size=args.image_size, seed=0, device=device)
    spec = backbone.spec
    text = text_embeddings(backbone, prompt_ensemble())
    gen = torch.Generator().manual_seed(0)
    b = args.batch_size
    batch = _batch(spec, b, device, gen)
    kw = {"warmup": args.warmup, "iters": args.iters}
    rows = []

    def add(label, seconds, n_images=None):
        rows.append((label, seconds * 1e3, (n_images / seconds) if n_images else None))
        # each row as soon as it is measured: a run cut short by a timeout still leaves its rows in the log
        print(f"measured: {label}: {seconds * 1e3:.2f} ms", flush=True)

    def frozen():
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            frozen_tokens(backbone, batch["image"])
    add(f"frozen encoder forward (B={b})", _time(frozen, device, **kw), b)
    base = TrainConfig(data="", target="Brain", out="")
    t_bare = _time(_step_fn(backbone, base._replace(method="naive", vaca=False), text, batch, device, amp, "bare"),
                   device, **kw)
    add(f"bare adapter step (B={b})", t_bare, b)
    for extra in args.sweep:
        eb = _batch(spec, extra, device, gen)
        t = _time(_step_fn(backbone, base._replace(method="naive", vaca=False), text, eb, device, amp, "bare"),
                  device, **kw)
        add(f"bare adapter step (B={extra})", t, extra)
    t_naive = t_match = t_match_exact = None
    for bb in args.batch_sizes:  # the batch sizes: every step kind at each
        eb = batch if bb == b else _batch(spec, bb, device, gen)
        tn = _time(_step_fn(backbone, base._replace(method="naive", vaca=False), text, eb, device, amp, "full"),
                   device, **kw)
        add(f"naive-pooling step (B={bb})", tn, bb)
        tb = _time(_step_fn(backbone, base._replace(method="naive", vaca=False), text, eb, device, amp, "full",
                            bilora_domains=5), device, **kw)
        add(f"BiLoRA step, 5th domain (naive objective) (B={bb})", tb, bb)
        tm = _time(_step_fn(backbone, base._replace(method="match", vaca=True, gate_mode="batched"), text, eb,
                            device, amp, "full"), device, **kw)
        add(f"matching+VACA step, batched gate (B={bb})", tm, bb)
        te = _time(_step_fn(backbone, base._replace(method="match", vaca=True, gate_mode="sequential"), text, eb,
                            device, amp, "full"), device, **kw)
        add(f"matching+VACA step, exact sequential gate (B={bb})", te, bb)
        if bb == b:
            t_naive, t_match, t_match_exact = tn, tm, te
    if args.decompose:  # which half of matching+VACA costs what: each one alone on top of the naive step
        for label, over in (("naive step + VACA only", dict(method="naive", vaca=True)),
                            ("matching only (batched gate, no VACA)", dict(method="match", vaca=False,
                                                                           gate_mode="batched"))):
            t = _time(_step_fn(backbone, base._replace(**over), text, batch, device, amp, "full"), device, **kw)
            add(f"{label} (B={b})", t, b)

    # gates alone on one batch's patch features (B * N of them) and image features (B)
    n = b * spec.grid ** 2
    f = torch.nn.functional.normalize(torch.randn(n, spec.embed_dim, generator=gen), dim=-1).to(device)
    y = (torch.rand(n, generator=gen) < 0.2).float().to(device)
    v = torch.ones(n, device=device)
    c = torch.nn.functional.normalize(torch.randn(2, spec.embed_dim, generator=gen), dim=-1).to(device)
    one = torch.ones((), device=device)

    bank = CentroidBank(8, spec.embed_dim).to(device)
    bank.c_pos[:], bank.c_neg[:], bank.init_pos[:], bank.init_neg[:] = c[0], c[1], 1.0, 1.0
    # contiguous like the stacked features of a training step (an expanded view would be copied per call)
    f_seg, f_img = f.expand(4, n, spec.embed_dim).contiguous(), f[:b].expand(4, b, spec.embed_dim).contiguous()

    def gates_batched():  # what one training step runs: 4 seg slots (B*N unit features) + 4 det slots (B)
        bank.step(0, f_seg, y, v, unit=True)
        bank.step(4, f_img, y[:b], v[:b], unit=True)
    t_gates = _time(gates_batched, device, **kw)
    add(f"batched gates, all 8 slots of a step ({n} patch features/layer)", t_gates)

    def gates_exact(backend):  # same 8 slots through the exact fast sequential gate (compiled in warm-up)
        bank_exact = CentroidBank(8, spec.embed_dim, mode="sequential", scan_backend=backend).to(device)
        bank_exact.load_state_dict(bank.state_dict())
        return lambda: (bank_exact.step(0, f_seg, y, v), bank_exact.step(4, f_img, y[:b], v[:b]))
    t_gates_exact = _time(gates_exact("jax"), device, **kw)
    add(f"exact fast sequential gates, all 8 slots of a step, JAX scan ({n} patch features/layer)", t_gates_exact)
    # issue 12: the fused kernels (the exact training steps above use the default one on CUDA), each at its
    # default warps and a small sweep; one launch of ~ms per call plus one Triton compile per row
    triton_rows = [("chords", None), ("chords", 2), ("chords", 8), ("dots", None), ("dots", 2), ("dots", 4)]
    t_gates_triton = best_triton = None
    if device.type == "cuda":
        from adsim.model import gate_triton as _gate_triton

        for kernel, warps in triton_rows:
            default = _gate_triton.default_num_warps(kernel, spec.embed_dim)
            warps = warps or default
            name = f"{kernel}, {warps} warp{'s' * (warps > 1)}"
            if warps == default:
                name += (", match_sequential's default" if kernel == _gate_triton.resolve_kernel(_gate_triton.DEFAULT_KERNEL, "ema")
                         else ", default warps")
            t = _time(_triton_variant(gates_exact("triton"), kernel, warps), device, **kw)
            add(f"exact sequential gates, all 8 slots, Triton kernel ({name}) ({n} patch features/layer)", t)
            if t_gates_triton is None or t < t_gates_triton:
                t_gates_triton, best_triton = t, name
    else:
        add("exact sequential gates, all 8 slots, Triton kernels (chords at 2/4/8 warps, dots at 1/2/4) -- "
            "skipped: need CUDA (tested on the CPU under Triton's interpreter, tests/adsim/test_adsim_gate_triton.py)",
            float("nan"))
    t_exact_one = _time(lambda: match_sequential(f[None], y, v, c[:1], c[1:], one[None], one[None],
                                                 scan_backend="jax"), device, **kw)
    add(f"exact fast sequential gate, one layer ({n} features)", t_exact_one)
    if device.type == "cuda":  # the same decisions scanned on the host CPU (features copied over)
        t_exact_host = _time(lambda: match_sequential(f[None], y, v, c[:1], c[1:], one[None], one[None],
                                                      scan_device="cpu"), device, **kw)
        add(f"exact fast sequential gate, one layer, scan on the host CPU ({n} features)", t_exact_host)
    if not args.skip_literal:  # seconds per call on a GPU: the test oracle, not a training path
        t_seq = _time(lambda: match(f, y, v, c[0], c[1], one, one, mode="sequential"), device,
                      warmup=1, iters=max(1, min(3, args.iters)))
        add(f"literal sequential loop, one layer ({n} features)", t_seq)
    # the compiled rows last (minutes of compilation on a GPU): the eager rows and gates are in the log first
    t_comp = _compiled_steps(args, backbone, base, text, batch, device, amp, add, kw)
    t_gates_comp = None
    if "match" in args.compile_steps:
        t_gates_comp = _compiled_gates(args, bank, [(0, f_seg, y, v), (4, f_img, y[:b], v[:b])], device, kw)
        add(f"batched gates, all 8 slots, compiled {args.compile_label} ({n} patch features/layer)", t_gates_comp)

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run, numbers meaningless)"
    lines = [f"### adsim GPU benchmark -- {gpu}",
             "",
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; backbone {spec.name} at {spec.image_size} px "
             f"({spec.grid}x{spec.grid} patches), random weights, synthetic images, "
             f"{'bf16 autocast' if amp else 'fp32'}; torch {torch.__version__}; median of {args.iters} timed calls "
             f"after {args.warmup} warm-up calls.",
             "",
             "| measurement | ms per call | images/s |",
             "|---|---:|---:|"]
    lines += [f"| {label} | {ms:.2f} | {'' if ips is None else f'{ips:.1f}'} |" for label, ms, ips in rows]
    checks = [
        ("matching+VACA step <= 1.10 x naive step", t_match / t_naive, 1.10, "<="),
        ("batched gates <= 2% of the matching+VACA step", t_gates / t_match, 0.02, "<="),
        (f"exact sequential gates ({'JAX scan' if t_gates_triton is None else f'fastest Triton row: {best_triton}'})"
         " <= 5% of the exact matching+VACA step (issue 12)", (t_gates_triton or t_gates_exact) / t_match_exact,
         0.05, "<="),
        ("matching+VACA throughput >= 80% of bare adapter step", t_bare / t_match, 0.80, ">="),
    ]
    # the default mode on CUDA (train without --compile: compiled, reduce-overhead): each ratio against the
    # compiled step of the same kind; a step that failed to compile fails its targets (nan)
    c = args.compile_label
    nan = float("nan")
    if args.compile_steps:
        checks.append((f"default mode (compiled {c}): matching+VACA step <= 1.10 x naive step",
                       t_comp.get("match", nan) / t_comp.get("naive", nan), 1.10, "<="))
        checks.append((f"default mode (compiled {c}): matching+VACA throughput >= 80% of bare adapter step",
                       t_comp.get("bare", nan) / t_comp.get("match", nan), 0.80, ">="))
        checks.append((f"default mode (compiled {c}): batched gates (compiled) <= 2% of the matching+VACA step",
                       (t_gates_comp or nan) / t_comp.get("match", nan), 0.02, "<="))
        for kind in args.compile_steps:
            checks.append((f"compiled {c}: {_COMPILED[kind][0]} compiles and runs (1 = yes)",
                           float(kind in t_comp), 1.0, ">="))
    if t_comp:
        from torch._dynamo.utils import counters
        graphs = (f"CUDA-graph skips: {counters['inductor']['cudagraph_skips']} (0 = every compiled region ran as a "
                  "CUDA graph)" if args.compile_mode == "reduce-overhead" else "no CUDA graphs in this mode")
        lines += ["", f"Compiled rows: `torch.compile` mode {args.compile_mode!r}, backend {args.compile_backend!r} "
                  f"(adsim.training.compiled_step: everything after the frozen trunk, forward and backward); {graphs}."]
    lines += ["", "| target (issue 7, 12, 14) | measured | met? |", "|---|---:|---|"]
    for label, value, bound, op in checks:
        ok = value <= bound if op == "<=" else value >= bound  # nan: False
        lines.append(f"| {label} | {value:.3f} | {'yes' if ok else 'NO'} |")
        if args.targets:
            with open(args.targets, "a") as f:
                f.write(f"{label}|{value:.3f}|{op} {bound:g}|{'yes' if ok else 'NO'}\n")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (only with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny backbone: a smoke run of the code path")
    p.add_argument("--backbone", default="ViT-L-14-336")
    p.add_argument("--image-size", type=int, default=None, help="default: the backbone's (238 for ViT-L-14-336)")
    p.add_argument("--batch-size", type=int, default=16, help="batch of the frozen/bare steps, gates and targets")
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[16, 32], help="batches of the naive/matching steps")
    p.add_argument("--sweep", type=int, nargs="*", default=[1, 32], help="extra batch sizes for the bare step")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"), help="markdown file to append to")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--decompose", action="store_true",
                   help="also time the naive step with VACA only and matching without VACA (batch --batch-size)")
    p.add_argument("--skip-literal", action="store_true", help="skip timing the literal per-feature loop (~8 s/call)")
    p.add_argument("--targets", default=None, help="also append the targets as name|measured|target|ok rows here")
    p.add_argument("--compile-steps", nargs="*", choices=tuple(_COMPILED), default=list(_COMPILED),
                   help="steps timed compiled (adsim.training.compiled_step) at --batch-size; no value: none")
    p.add_argument("--compile-mode", choices=compiled_step.MODES[1:], default=None,
                   help="torch.compile mode of the compiled rows (default: reduce-overhead on CUDA, default on CPU)")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend (default: inductor; aot_eager in the CPU smoke run)")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_adsim: CUDA is not available on this machine, so there is nothing to benchmark.\n"
              "Run it on a GPU machine, or exercise the code path with: --device cpu --tiny", file=sys.stderr)
        return 1
    if args.device == "cpu" and not args.tiny:
        print("gpu_adsim: on CPU only the --tiny smoke run is supported (ViT-L on CPU would take hours)",
              file=sys.stderr)
        return 1
    if args.tiny and args.device == "cpu":
        args.sweep = [s for s in args.sweep if s <= 4] or []
        args.batch_sizes = [s for s in args.batch_sizes if s <= 4] or [args.batch_size]
    smoke = args.device == "cpu"
    args.compile_mode = args.compile_mode or ("default" if smoke else "reduce-overhead")
    args.compile_backend = args.compile_backend or ("aot_eager" if smoke else "inductor")
    if args.compile_backend != "inductor" and args.compile_mode != "default":
        p.error(f"--compile-mode {args.compile_mode} needs --compile-backend inductor")
    args.compile_label = (args.compile_mode if args.compile_backend == "inductor" else
                          f"{args.compile_backend}, capture only, no codegen")
    if args.batch_size not in args.batch_sizes:
        args.batch_sizes = [args.batch_size, *args.batch_sizes]
    if args.compile_steps and args.compile_mode == "reduce-overhead":
        torch._logging.set_logs(perf_hints=True)  # the reason whenever a region is not CUDA-graphed
    table = run(args)
    print(table)
    if not args.no_write:
        append_table(str(args.results), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
