"""How many seeds one program call runs."""
from __future__ import annotations

# Seed counts up to this run in one chunk of this many seeds; larger ones in chunks of ``chunk``.
# Two compiled shapes per experiment at most, whatever the seed counts (a test counts them).
SMALL_CHUNK = 64


def chunk_size(S: int, chunk: int, ndev: int = 1) -> int:
    """Seeds per program call for a run of ``S`` seeds: ``SMALL_CHUNK`` when ``S`` is at most
    that (and ``chunk`` is larger), else ``chunk``; rounded up to a multiple of the device count
    ``ndev``. Fixed shapes, the last chunk padded: a new seed count does not recompile."""
    if S <= SMALL_CHUNK < chunk:
        chunk = SMALL_CHUNK
    return -(-chunk // ndev) * ndev
