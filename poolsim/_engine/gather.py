"""Per-chunk device results to one set of host arrays."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

def gather(outs: list, S: int, chunk: int, on_device: bool):
    """One pytree of NumPy arrays with leading axis ``S`` from the per-batch device results
    ``outs`` (each with leading axis ``chunk``; the last one padded; ``None`` leaves -- fields
    not asked for -- stay ``None``). Every transfer is started (``copy_to_host_async``) before
    the first is waited on. ``on_device``: the batches are concatenated on the device and each
    field crosses once; else each batch's arrays are copied into preallocated host arrays
    (several devices: a batch's array is spread over them; CPU: the copy is the host's own
    memory, and the result stays writeable)."""
    last = S - (len(outs) - 1) * chunk
    if on_device:
        outs = outs[:-1] + [jax.tree.map(lambda a: a[:last], outs[-1])] if last < chunk else outs
        whole = jax.tree.map(lambda *a: jnp.concatenate(a) if len(a) > 1 else a[0], *outs)
        leaves, tree = jax.tree.flatten(whole)
        for a in leaves:
            a.copy_to_host_async()
        return jax.tree.unflatten(tree, [np.asarray(a) for a in leaves])
    flat = [jax.tree.flatten(o) for o in outs]
    tree = flat[0][1]
    for leaves, _ in flat:
        for a in leaves:
            a.copy_to_host_async()
    host = [np.empty((S,) + a.shape[1:], a.dtype) for a in flat[0][0]]
    for i, (leaves, _) in enumerate(flat):
        k = min(chunk, S - i * chunk)
        for dst, a in zip(host, leaves):
            dst[i * chunk:i * chunk + k] = np.asarray(a)[:k]
    return jax.tree.unflatten(tree, host)
