"""BiLoRA: Zhu, Zhang, Dong, Koniusz, "BiLoRA: Almost-Orthogonal Parameter Spaces for Continual Learning",
CVPR 2025, pp. 25613-25622 -- the continual-learning baseline of the paper's Fig. "final", run in the
domain-addition protocol (``python -m adsim protocol``, method ``bilora``), and Table 1's ``BiLORA*`` row:
trained by ``python -m adsim train --recipe bilora`` with the train loop's ``"sequential"`` schedule (the
training domains one at a time in ``cfg.train_domains`` order, ``cfg.epochs`` each, one BiLoRA update per
domain, a fresh optimiser per domain), rebuilt from the run folder by the ``TRAINED`` registry.

What is public about BiLoRA and what this file takes from it: each task's weight update is a *bilinear*
low-rank form ``Delta W_t = U_t K_t V_t^T`` whose outer factors are fixed frequency-domain bases and whose
small core ``K_t`` is the task's only trainable parameter; tasks that use different frequency components
occupy (almost) orthogonal parameter subspaces, so training a new task's core leaves the updates of the
earlier tasks untouched and interferes little with them. The authors' code was not available to this
project; the frequency bases, the rule that picks each task's components and the rank are this file's
choices, listed below and in ``docs/recipes.md``.

What this file computes, for every weight ``W0 (m, n)`` of the adapter head's linear layers (seg and det
adapters, ``down`` and ``up``, every layer):

* **Bases.** ``C_m (m, m)`` and ``C_n (n, n)``: orthonormal DCT-II matrices (:func:`dct_basis`; column ``k``
  = frequency ``k``).
* **One update per domain.** Domain ``t`` draws ``r`` row frequencies ``P_t`` of ``m`` and ``r`` column
  frequencies ``Q_t`` of ``n``, uniformly without replacement, from a generator seeded by
  ``(seed, t, slot)`` (:func:`draw_support`); ``Delta W_t = C_m[:, P_t] K_t C_n[:, Q_t]^T`` with the core
  ``K_t (r, r)`` initialised to zero, so the step starts from the previous step's function. The layer's
  weight is ``W0 + sum_t Delta W_t`` (:class:`BilinearDelta`, a ``torch.nn.utils.parametrize``
  parametrisation: the head's forward is unchanged).
* **What trains.** Only the current domain's cores. ``W0``, every bias and every earlier core are
  frozen (BiLoRA freezes the pre-trained weights and the earlier tasks' parameters). The cores of a
  run's domains live in tensors of a fixed size (the current core a parameter, the finished ones a
  buffer, the current domain's index a buffer): starting a domain changes values, not the module, so a
  compiled training step reuses its graph for every domain.
* **Near-orthogonality, measured.** The DCT bases are orthonormal, so ``<Delta W_s, Delta W_t>_F`` is the
  inner product of the two cores on the shared frequency pairs ``(P_s & P_t) x (Q_s & Q_t)`` only: it is
  exactly 0 when the two domains share no pair, and in general ``|cos(Delta W_s, Delta W_t)|`` is at most
  ``||K_s on shared|| ||K_t on shared|| / (||K_s|| ||K_t||)`` (Cauchy-Schwarz; :func:`overlap_bound`).
  With independent uniform draws the expected fraction of shared pairs is ``(r / m) (r / n)``.
  :func:`update_cosines` measures the Frobenius cosines of every pair of domains' updates.

Departures from BiLoRA (also in ``docs/recipes.md``, section "BiLoRA and Mao et al."):

* The adapted weights are the adapter head's, not a pre-trained ViT's attention weights: in adsim the
  CLIP tower is frozen for every method and the adapter head is the trainable part. ``W0`` is the head's
  initialisation (the same seeded initialisation as every other protocol method of the (target, seed)),
  not a pre-trained weight.
* DCT-II bases and uniform random frequency choice per domain (rank ``r = min(RANK, min(m, n) // 2)``):
  the frequency transform, the selection rule and the rank of the published method are not reproduced.
* No classifier head, replay or task identity: the objective is the adapter head's own (naive pooling,
  no matching, no VACA), scored on the unseen target after each step like every other protocol method.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn
from torch.nn.utils import parametrize

from adsim.config.prompts import prompt_texts
from adsim.methods.baselines.common import load_checked, positive_int
from adsim.methods.registry import HeadMethod, Trainer, register_trained, register_trainer
from adsim.model.head import adapter_bottlenecks, features_from_bottlenecks, make_head, text_embeddings, trunk_tokens
from adsim.model.objective import objective

RANK = 8  # frequencies per side and domain (capped at half the smaller side of each weight)


def dct_basis(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix ``(n, n)``: column ``k`` is frequency ``k``,
    ``C[i, k] = s_k cos(pi (i + 1/2) k / n)`` with ``s_0 = sqrt(1/n)``, ``s_k = sqrt(2/n)``; ``C^T C = I``."""
    positive_int("n", n)
    i = torch.arange(n, dtype=torch.float64)[:, None]
    k = torch.arange(n, dtype=torch.float64)[None, :]
    c = torch.cos(math.pi * (i + 0.5) * k / n) * math.sqrt(2.0 / n)
    c[:, 0] = math.sqrt(1.0 / n)
    return c.float()


def draw_support(m: int, n: int, rank: int, seed: int, domain: int, slot: int) -> tuple:
    """``(P (rank,), Q (rank,))``: row and column frequencies of one domain's update of one weight, drawn
    uniformly without replacement from a generator seeded by ``(seed, domain, slot)`` (sorted)."""
    if not 1 <= rank <= min(m, n):
        raise ValueError(f"rank must be in [1, {min(m, n)}] for a ({m}, {n}) weight, got {rank!r}")
    gen = torch.Generator().manual_seed(((int(seed) * 1_000_003 + int(domain)) * 1_000_003 + int(slot)) % 2 ** 63)
    return (torch.randperm(m, generator=gen)[:rank].sort().values,
            torch.randperm(n, generator=gen)[:rank].sort().values)


class SupportsRederivedWarning(UserWarning):
    """A bilora state without saved frequency supports was loaded: the supports were drawn again from the
    run's seed (:func:`draw_support`), which cannot prove them equal to the ones the head was trained on."""


SUPPORTS = ("support_rows", "support_cols")  # the state-dict entries of the frequency supports


def _zero_padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t (n, ...)`` with zero rows appended up to ``rows`` (``t`` itself when it has that many)."""
    extra = rows - t.shape[0]
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra > 0 else t


class BilinearDelta(nn.Module):
    """Parametrisation of one weight ``W0 (m, n)``: ``W0 + sum_t C_m[:, P_t] K_t C_n[:, Q_t]^T``.

    Storage, fixed for ``capacity`` domains so that starting a domain changes tensor values, not the module
    (a compiled step keeps its graph from one domain to the next; ``tests/adsim/test_adsim_bilora_train.py``
    counts the graphs):

    * ``core (r, r)`` -- the parameter: the current domain's ``K_t`` (the same tensor for every domain;
      ``requires_grad`` from the first domain on);
    * ``bank (T, r, r)`` -- buffer: the finished domains' cores (frozen), zero from the current domain on;
    * ``support_rows (T, r)``, ``support_cols (T, r)`` -- buffers (int64): ``P_t``, ``Q_t`` per domain slot,
      saved, so a loaded head uses the frequencies it was trained on whatever :func:`draw_support` would
      draw now;
    * ``started`` -- buffer (int64 scalar): how many domains have started (the current one is
      ``started - 1``).

    ``T`` = ``capacity``; a domain beyond it grows the buffers by one slot (a new shape). The forward adds
    all ``T`` slots in domain order, each ``C_m[:, P_t] K_t C_n[:, Q_t]^T`` with ``K_t`` = ``core`` at the
    current slot and ``bank[t]`` elsewhere; a slot not started has a zero core, so it adds exact zeros and
    the weight is bitwise the sum over the started domains alone.

    A state in the per-domain layout (one parameter ``cores.<t>`` per started domain, ``support_rows
    (t, r)``) loads into this layout. A state without supports (written before they were saved) keeps
    the supports drawn for this module and sets ``supports_rederived``."""

    basis_rows: torch.Tensor
    """``C_m (m, m)``: the DCT basis of the rows (buffer)."""
    basis_cols: torch.Tensor
    """``C_n (n, n)``: the DCT basis of the columns (buffer)."""
    support_rows: torch.Tensor
    """``(T, r)`` int64: ``P_t`` per domain slot (buffer)."""
    support_cols: torch.Tensor
    """``(T, r)`` int64: ``Q_t`` per domain slot (buffer)."""
    bank: torch.Tensor
    """``(T, r, r)``: the finished domains' cores (buffer)."""
    started: torch.Tensor
    """int64 scalar: how many domains have started (buffer)."""

    def __init__(self, m: int, n: int, rank: int, capacity: int = 0):
        super().__init__()
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative int (domains), got {capacity!r}")
        self.rank = rank
        self.register_buffer("basis_rows", dct_basis(m))
        self.register_buffer("basis_cols", dct_basis(n))
        self.register_buffer("support_rows", torch.zeros(capacity, rank, dtype=torch.int64))
        self.register_buffer("support_cols", torch.zeros(capacity, rank, dtype=torch.int64))
        self.register_buffer("bank", torch.zeros(capacity, rank, rank))
        self.register_buffer("started", torch.zeros((), dtype=torch.int64))
        self.core = nn.Parameter(torch.zeros(rank, rank), requires_grad=False)
        self.supports_rederived = False

    @property
    def domains(self) -> int:
        """How many domains have started (a host read of ``started``)."""
        return int(self.started)

    @property
    def capacity(self) -> int:
        """Domain slots held (``T``)."""
        return self.bank.shape[0]

    @property
    def rows(self) -> list:
        """``P_t`` of every started domain ``t``: ``[(r,)]``."""
        return list(self.support_rows[:self.domains])

    @property
    def cols(self) -> list:
        """``Q_t`` of every started domain ``t``: ``[(r,)]``."""
        return list(self.support_cols[:self.domains])

    @property
    def cores(self) -> list:
        """``K_t (r, r)`` of every started domain ``t``: the finished ones from ``bank``, the current one
        is ``core`` itself (the parameter)."""
        d = self.domains
        return [*self.bank[:max(d - 1, 0)], self.core][:d]

    def _grow(self, capacity: int) -> None:
        """Make room for ``capacity`` domains (new, larger buffers; zero slots appended)."""
        for name in (*SUPPORTS, "bank"):
            setattr(self, name, _zero_padded(getattr(self, name), capacity))

    def add_domain(self, rows: torch.Tensor, cols: torch.Tensor) -> nn.Parameter:
        """Freeze the current core into ``bank`` and start the next domain on frequencies ``(rows, cols)``
        (each ``(r,)``) with a zero core; returns the core (the parameter that trains). Its last gradient
        is dropped: it belongs to the finished domain."""
        if tuple(rows.shape) != (self.rank,) or tuple(cols.shape) != (self.rank,):
            raise ValueError(f"rows and cols must have shape ({self.rank},), got {tuple(rows.shape)}, "
                             f"{tuple(cols.shape)}")
        d = self.domains
        self._grow(d + 1)
        with torch.no_grad():
            if d > 0:
                self.bank[d - 1].copy_(self.core)
            self.core.zero_()
            self.support_rows[d].copy_(rows)
            self.support_cols[d].copy_(cols)
            self.started.fill_(d + 1)
        self.core.requires_grad_(True)
        self.core.grad = None
        return self.core

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        old = sorted((k for k in state_dict if k.startswith(prefix + "cores.")),
                     key=lambda k: int(k[len(prefix) + len("cores."):]))
        if old:  # one parameter per domain: the finished ones into the bank, the last one the core
            cores = [state_dict.pop(k) for k in old]
            n = len(cores)
            self._grow(n)
            bank = torch.zeros_like(self.bank)
            if n > 1:
                bank[:n - 1] = torch.stack(cores[:-1]).to(bank)
            state_dict[prefix + "bank"], state_dict[prefix + "core"] = bank, cores[-1]
            state_dict[prefix + "started"] = torch.tensor(n, dtype=torch.int64)
            for name in SUPPORTS:
                saved = state_dict.get(prefix + name)
                if saved is None:  # saved before the supports were: keep the drawn ones
                    self.supports_rederived = True
                    state_dict[prefix + name] = getattr(self, name)
                else:
                    state_dict[prefix + name] = _zero_padded(saved, self.capacity)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _slot(self, t: int, core: torch.Tensor) -> torch.Tensor:
        """``C_m[:, P_t] core C_n[:, Q_t]^T (m, n)`` on slot ``t``'s frequencies."""
        return self.basis_rows[:, self.support_rows[t]] @ core @ self.basis_cols[:, self.support_cols[t]].T

    def delta(self, t: int) -> torch.Tensor:
        """Domain ``t``'s update ``(m, n)``."""
        return self._slot(t, self.cores[t])

    def forward(self, w0: torch.Tensor) -> torch.Tensor:
        current = self.started - 1
        out = w0
        for t in range(self.capacity):
            out = out + self._slot(t, torch.where(current == t, self.core, self.bank[t])).to(w0.dtype)
        return out


def adapted_linears(head) -> list:
    """``[(slot name, nn.Linear)]``: every linear layer of the head's seg and det adapters, in a fixed order."""
    return [(f"{kind}{k}.{part}", getattr(ad, part))
            for kind, adapters in (("seg", head.seg_adapters), ("det", head.det_adapters))
            for k, ad in enumerate(adapters) for part in ("down", "up")]


def attach(head, *, rank: int = RANK, capacity: int = 0) -> list:
    """Put a :class:`BilinearDelta` on every adapter weight of ``head`` (in place) and freeze every other
    parameter of the head; returns the parametrisations in :func:`adapted_linears` order. ``capacity``:
    domain slots held from the start (a run's training domains: starting a domain then changes no
    shape); more domains grow them. A head that has matching centroids or VACA -> ``ValueError``
    (BiLoRA here adapts the naive head)."""
    if getattr(head, "vaca", None) is not None or getattr(head, "centroids", None) is not None:
        raise ValueError("bilora adapts the naive adapter head: the head must have no VACA and no matching "
                         "(recipe fields vaca=False and method other than 'match'; --recipe bilora sets them)")
    positive_int("rank", rank)
    for p in head.parameters():
        p.requires_grad_(False)
    head.register_load_state_dict_post_hook(_warn_rederived)
    out = []
    for _, lin in adapted_linears(head):
        m, n = lin.weight.shape
        bd = BilinearDelta(m, n, min(rank, min(m, n) // 2 or 1), capacity).to(lin.weight.device)
        parametrize.register_parametrization(lin, "weight", bd)
        lin.parametrizations.weight.original.requires_grad_(False)
        out.append(bd)
    return out


def _warn_rederived(head, incompatible) -> None:
    """Post-load hook of an attached head: one :class:`SupportsRederivedWarning` when the loaded state had no
    saved supports (a state :func:`load` has completed itself carries them)."""
    bds = parametrizations(head)
    if any(bd.supports_rederived for bd in bds):
        for bd in bds:
            bd.supports_rederived = False
        warnings.warn("a bilora state without saved frequency supports was loaded: they were re-derived from "
                      "the run's seed (draw_support, torch.randperm) and cannot be proven equal to the ones it "
                      "was trained on", SupportsRederivedWarning, stacklevel=2)


def parametrizations(head) -> list:
    """The :class:`BilinearDelta` of every adapter weight (``ValueError`` if :func:`attach` was not run)."""
    out = []
    for name, lin in adapted_linears(head):
        if not parametrize.is_parametrized(lin, "weight"):
            raise ValueError(f"adapter weight {name} carries no BiLoRA update (call attach first)")
        out.append(lin.parametrizations.weight[0])
    return out


def add_domain(head, domain: int, seed: int) -> list:
    """Start domain ``domain`` (0, 1, ...): freeze the earlier cores, start a zero core on freshly drawn
    frequencies per adapter weight; returns the trainable cores (the parameters of this step: every
    domain trains the same :attr:`BilinearDelta.core` tensors, the finished values move to ``bank``)."""
    bds = parametrizations(head)
    if any(bd.domains != domain for bd in bds):
        raise ValueError(f"domain must be the next domain index {bds[0].domains}, got {domain!r}")
    return [bd.add_domain(*draw_support(bd.basis_rows.shape[0], bd.basis_cols.shape[0], bd.rank, seed, domain, slot))
            for slot, bd in enumerate(bds)]


@torch.no_grad()
def update_cosines(head) -> torch.Tensor:
    """``(S, T, T)``: per adapter weight (``S`` slots) the Frobenius cosine ``<dW_s, dW_t> / (|dW_s| |dW_t|)``
    of every pair of domains' updates (NaN where an update is zero)."""
    out = []
    for bd in parametrizations(head):
        d = torch.stack([bd.delta(t).flatten() for t in range(bd.domains)]).double()
        norms = d.norm(dim=1)
        out.append((d @ d.T) / (norms[:, None] * norms[None, :]))
    return torch.stack(out)


@torch.no_grad()
def overlap_bound(bd: BilinearDelta, s: int, t: int) -> float:
    """Upper bound on ``|cos(dW_s, dW_t)|`` from the shared frequency pairs alone: the norms of the two
    cores restricted to ``(P_s & P_t) x (Q_s & Q_t)`` over their full norms (Cauchy-Schwarz); 0 when the
    domains share no frequency pair."""
    def restricted(a: int, b: int) -> float:
        rows = torch.isin(bd.rows[a], bd.rows[b])
        cols = torch.isin(bd.cols[a], bd.cols[b])
        core = bd.cores[a].double()
        full = float(core.norm())
        return float(core[rows][:, cols].norm()) / full if full > 0 else 0.0
    return restricted(s, t) * restricted(t, s)


def trainable(head) -> list:
    """The parameters that train at this step (the current domain's cores)."""
    return [p for p in head.parameters() if p.requires_grad]


# --------------------------------------------------------------------------- python -m adsim train --recipe bilora
# The run's head is the recipe's naive head (make_head: no matching, no VACA) with attach(); domain ``index``
# of cfg.train_domains gets its update on the frequencies drawn with ``cfg.seed`` (draw_support); the supports
# are saved with the cores (BilinearDelta's buffers), so a run folder's head does not depend on the draw.

def bilora_head(cfg, backbone, prompts, capacity: int | None = None):
    """The naive adapter head of ``cfg`` (``make_head``) with the text embeddings of ``prompts`` and a
    :class:`BilinearDelta` on every adapter weight (:func:`attach`; ``capacity`` domain slots, default one
    per domain of ``cfg.train_domains``), no domain added yet (nothing trains)."""
    spec = backbone.spec
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompts))
    attach(head, capacity=len(cfg.train_domains or ()) if capacity is None else capacity)
    return head


def build_head(cfg, backbone):
    """``Trainer.build``: :func:`bilora_head` with the prompts of ``cfg.prompts``."""
    return bilora_head(cfg, backbone, prompt_texts(cfg.prompts))


def start_domain(cfg, head, index: int) -> None:
    """``Trainer.start_domain``: :func:`add_domain` ``index`` with the run's seed (earlier cores frozen)."""
    add_domain(head, index, cfg.seed)


def train_forward(head, backbone, images: torch.Tensor):
    """Training forward: the head's features (``adsim.model.head.features``) on the frozen tower, without
    its NaN/inf check (a host sync; the training loop checks the loss instead)."""
    return features_from_bottlenecks(head, *adapter_bottlenecks(backbone, head, trunk_tokens(backbone, images)),
                                     check=False)


def train_loss(cfg, head, feats, batch: dict) -> tuple:
    """The naive head's objective (``adsim.model.objective.objective``) on the patch grid of ``feats``."""
    return objective(cfg, head, feats, batch, math.isqrt(feats.seg[0].shape[1]))


def as_method(cfg, backbone, head) -> HeadMethod:
    """The head as a :class:`HeadMethod` named ``bilora`` (the run's scoring and input normalisation)."""
    return HeadMethod(backbone, head, scoring=cfg.scoring, clip_norm=cfg.clip_norm, name="bilora")


def domains_in(state: dict) -> int:
    """How many domains a checkpoint state has started (those of its first adapter weight): its
    ``started`` entry, or, in a state with one parameter per domain, the number of ``cores.<t>``."""
    first = "seg_adapters.0.down.parametrizations.weight.0."
    if torch.is_tensor(state.get(first + "started")):
        return int(state[first + "started"])
    return len({k[len(first) + len("cores."):].split(".")[0] for k in state if k.startswith(first + "cores.")})


def capacity_in(state: dict) -> int:
    """Domain slots of a checkpoint state (its first adapter weight's ``bank`` rows), or, in a state with one
    parameter per domain, the number of domains."""
    bank = state.get("seg_adapters.0.down.parametrizations.weight.0.bank")
    return bank.shape[0] if torch.is_tensor(bank) and bank.ndim == 3 else domains_in(state)


def load(cfg, backbone, record: dict, state: dict) -> HeadMethod:
    """Rebuild the method of a ``bilora`` run: :func:`bilora_head` with the run's recorded prompts, one
    :func:`start_domain` per domain the checkpoint holds (a ``best`` checkpoint may hold fewer than
    ``cfg.train_domains``), then the state -- its saved frequency supports replace the drawn ones; a state
    without them (saved before they were) keeps the drawn ones with a :class:`SupportsRederivedWarning` naming
    ``record["checkpoint_path"]``; a state that does not fit -> ``ValueError``."""
    if not isinstance(state, dict) or domains_in(state) == 0:
        keys = sorted(state)[:4] if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"checkpoint state is not a bilora state (no 'parametrizations.weight.0.started' "
                         f"or '.cores' entries); keys: {keys}")
    device = next(backbone.model.parameters()).device
    head = bilora_head(cfg, backbone, record["prompts"], capacity_in(state)).to(device)  # follows the bases
    for index in range(domains_in(state)):
        start_domain(cfg, head, index)
    own = head.state_dict()
    absent = [k for k in own if k.rsplit(".", 1)[-1] in SUPPORTS and k not in state]
    if absent:  # a checkpoint written before the supports were saved: the ones just drawn from the seed
        state = {**state, **{k: own[k] for k in absent}}
        warnings.warn(f"{record.get('checkpoint_path', 'the bilora checkpoint')} holds no frequency supports "
                      f"(written before they were saved): they were re-derived from the run's seed {cfg.seed} "
                      f"(draw_support, torch.randperm of torch {torch.__version__}) and cannot be proven equal to "
                      f"the ones the head was trained on; its scores may differ from the trained head's",
                      SupportsRederivedWarning, stacklevel=2)
    load_checked(head, state, "bilora head this adsim version builds from the run's config")
    return as_method(cfg, backbone, head).eval()


register_trainer("bilora", Trainer(build=build_head, forward=train_forward, loss=train_loss, method=as_method,
                                   schedule="sequential", start_domain=start_domain))
register_trained("bilora", load)
