"""Vectorised JAX Monte Carlo: a batch of seeds at once, ``lax.scan`` walks K.

For each seed: draw ``K_max`` domain means from the meta-distribution, then the per-domain data
(either materialised samples ``(K_max, n, d)`` or their sufficient statistics), then scan over the
requested K values -- every K is the prefix ``1..K`` of the same domains, handled with 0/1 masks so
shapes never change and the whole experiment is traced once. :func:`one_seed` states one seed's
computation; the engine (:func:`estimate_batch`) computes the same numbers for a whole chunk of seeds with
the seed axis leading (one scan, one batched matching loop per K), and the random keys come from
:mod:`poolsim._rng` (JAX's Threefry numbers, faster bits on CPU). ``simulate(...,
distributed=True)`` splits the seeds over the processes of a ``jax.distributed`` job.

Sufficient-statistics path (``materialize=False``): with ``x_{k,i} ~ N(mu_k, s^2 I)``,

* the domain sample mean is exactly ``xbar_k = mu_k + s / sqrt(n) z_k``;
* the mean of ``n'`` points drawn with replacement from domain k's ``n`` samples is jointly
  Gaussian with ``xbar_k``: given the draw's index multiset with ``q = sum_i c_i^2`` (c_i = times
  sample i was drawn; ``q`` itself is drawn from its exact law, :func:`collision_law`),
  ``Cov(xbar, sub) = s^2 / n`` and ``Var(sub) = s^2 q / n'^2``, hence
  ``sub = xbar_k + s sqrt(q / n'^2 - 1 / n) z'`` exactly (q/n'^2 >= 1/n by Cauchy-Schwarz);
* the matching init ``"median"`` is the coordinate-wise median of the *domain means* (the sample
  median needs the samples -- use ``materialize=True`` for the paper's sample-wise median).

So the cost does not grow with n. ``materialize=True`` draws every sample (needed for the paper's
sample median init and for resampling actual points).

Modules, one per concern (each imports only those listed after it):

* :mod:`.run` -- :func:`simulate`: chunks of seeds dispatched, gathered, reduced; several processes;
* :mod:`.compiled` -- the compiled programs per (spec, dtype, devices), stored across processes;
* :mod:`.gather` -- per-chunk device results to host arrays;
* :mod:`.estimates` -- one seed's estimates (:func:`one_seed`) and a batch's (:func:`estimate_batch`);
* :mod:`.subsample`, :mod:`.matching`, :mod:`.medians`, :mod:`.moments` -- the strategies' pieces and
  the on-device summary;
* :mod:`.draws` -- every random number of a seed;
* :mod:`.chunks` -- seeds per program call: the memory budget and the bytes a seed needs;
* :mod:`.spec` -- :class:`Spec` and :class:`SeedResult`.
"""
from __future__ import annotations

from .chunks import (BUDGET_ENV, SMALL_CHUNK, MemoryBudgetError, Plan, SeedBytes, chunk_plan,
                     parse_bytes, resolve_budget, rung, seed_bytes)
from .compiled import compiled, compiled_moments, compiled_vmapped, store_ident
from .draws import Draws, SubDraws, collision_law, draw, draw_batch, full_sub, group_sub, sub_draws
from .estimates import estimate_batch, one_seed
from .gather import Gatherer, gather
from .matching import STAGES, batched_match
from .medians import (chunk_medians, few_prefix_medians, grouped_medians, host_medians_outside,
                      host_prefix_medians, prefix_medians)
from .moments import PAIRS, QUANTITIES, Moments, Summary, combine, moments
from .run import AHEAD, DISTRIBUTED_HELP, process_block, simulate
from .spec import (FULL_WIDTH, PATH_ENV, PATHS, STRATEGIES, Group, SeedResult, Spec, accelerator_path, groups,
                   widths)
from .subsample import PAIRWISE_MAX, chosen_domains, subsample_mean

__all__ = ["AHEAD", "DISTRIBUTED_HELP", "Draws", "Moments", "PAIRS", "QUANTITIES", "SMALL_CHUNK",
           "FULL_WIDTH", "Group", "STAGES", "STRATEGIES", "SeedResult", "Spec", "SubDraws", "Summary", "batched_match",
           "chunk_medians", "chunk_plan", "BUDGET_ENV", "MemoryBudgetError", "Plan", "SeedBytes",
           "parse_bytes", "resolve_budget", "rung", "seed_bytes", "collision_law", "combine", "compiled", "compiled_moments",
           "compiled_vmapped", "draw", "draw_batch", "estimate_batch", "few_prefix_medians", "full_sub",
           "Gatherer", "gather", "grouped_medians", "host_medians_outside", "host_prefix_medians", "moments",
           "one_seed", "prefix_medians", "process_block", "simulate", "store_ident", "sub_draws",
           "subsample_mean", "groups", "widths", "group_sub", "chosen_domains", "PAIRWISE_MAX", "PATH_ENV", "PATHS",
           "accelerator_path"]
