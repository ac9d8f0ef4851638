"""Per-chunk device results to one set of host arrays."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def gather(parts: list, on_device: bool):
    """One pytree of NumPy arrays from the per-chunk device results ``parts``: pairs ``(out, k)``,
    of which the first ``k`` rows (leading axis) count -- the rest pad the chunk; ``None`` leaves
    (fields not asked for) stay ``None``. Every transfer is started (``copy_to_host_async``)
    before the first is waited on. ``on_device``: the chunks are concatenated on the device and
    each field crosses once; else each chunk's arrays are copied into preallocated host arrays
    (several devices: a chunk's array is spread over them; CPU: the copy is the host's own
    memory, and the result stays writeable)."""
    if on_device:
        cut = [jax.tree.map(lambda a, k=k: a[:k] if k < a.shape[0] else a, o) for o, k in parts]
        whole = jax.tree.map(lambda *a: jnp.concatenate(a) if len(a) > 1 else a[0], *cut)
        leaves, tree = jax.tree.flatten(whole)
        for a in leaves:
            a.copy_to_host_async()
        return jax.tree.unflatten(tree, [np.asarray(a) for a in leaves])
    for o, _ in parts:
        for a in jax.tree.leaves(o):
            a.copy_to_host_async()
    into = Gatherer(sum(k for _, k in parts))
    for o, k in parts:
        into.add(o, k)
    return into.result()


class Gatherer:
    """Host arrays with leading axis ``S`` filled chunk by chunk (:meth:`add`), so that a finished
    chunk's device arrays can be dropped at once: the results are held once, not twice."""

    def __init__(self, S: int):
        self.S, self.pos, self.tree = S, 0, None
        self.host: list[np.ndarray] | None = None

    def add(self, out, k: int) -> None:
        """Copy the first ``k`` rows of every leaf of ``out`` (a finished chunk) in place."""
        leaves, tree = jax.tree.flatten(out)
        if self.host is None:
            self.tree = tree
            self.host = [np.empty((self.S,) + a.shape[1:], a.dtype) for a in leaves]
        for dst, a in zip(self.host, leaves):
            dst[self.pos:self.pos + k] = np.asarray(a)[:k]
        self.pos += k

    def result(self):
        return jax.tree.unflatten(self.tree, self.host)
