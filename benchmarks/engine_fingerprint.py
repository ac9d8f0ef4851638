"""sha256 (first 16 hex digits) of every per-seed field of the engine, for checking that a change
keeps the numbers: run it on two revisions on the same machine and compare the JSON files (float32
code generation differs between CPUs, so fingerprints from two machines need not agree).

    python benchmarks/engine_fingerprint.py OUT.json [SEEDS]   # default 2000 seeds
"""
import hashlib
import json
import sys

import numpy as np

from poolsim import experiments as ex

# every registered experiment, both paths, and the non-default init / layout
CASES = [("domain_addition", dict(materialize=False)), ("domain_addition", dict(materialize=True)),
         ("domain_addition", dict(materialize=False, init="mean")),
         ("asymptotic", dict(materialize=False)), ("asymptotic", dict(materialize=True)),
         ("symmetric", dict(materialize=False)), ("symmetric", dict(materialize=True)),
         ("symmetric", dict(materialize=True, layout="balanced"))]
S = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
out = {}
for name, p in CASES:  # a padded second chunk at the default 1,024
    res, P = ex.simulate(name, seeds=S, **p)
    key = name + " " + json.dumps(p, sort_keys=True)
    out[key] = {f: hashlib.sha256(np.ascontiguousarray(getattr(res, f)).tobytes()).hexdigest()[:16]
                for f in res._fields}
    print(key, out[key], flush=True)
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh, indent=1)
