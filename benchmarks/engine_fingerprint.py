"""sha256 (first 16 hex digits) of every per-seed field of the engine, for checking that a change keeps
the numbers: run it on two revisions of the same machine and compare. `python benchmarks/engine_fingerprint.py OUT.json [SEEDS]`."""
import hashlib, json, sys
import numpy as np
from poolsim import _engine, experiments as ex
CASES = [("domain_addition", dict(materialize=False)), ("domain_addition", dict(materialize=True)),
         ("domain_addition", dict(materialize=False, init="mean")),
         ("asymptotic", dict(materialize=False)), ("asymptotic", dict(materialize=True)),
         ("symmetric", dict(materialize=False)), ("symmetric", dict(materialize=True)),
         ("symmetric", dict(materialize=True, layout="balanced"))]
S = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
out = {}
for name, p in CASES:
    res, P = ex.simulate(name, seeds=S, **p)
    key = name + " " + json.dumps(p, sort_keys=True)
    out[key] = {f: hashlib.sha256(np.ascontiguousarray(getattr(res, f)).tobytes()).hexdigest()[:16] for f in res._fields}
    print(key, out[key], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
