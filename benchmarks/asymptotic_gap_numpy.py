"""Check, outside poolsim: matching's finite-K gap to its fixed-tau limit in the `asymptotic` set-up.

Not a test and not project code: a plain NumPy loop that shares nothing with the engine. It draws
the domain sample means xbar = 0.5 z + B 1.5 e1 + (0.8 / sqrt(150)) e (contaminated, p = 0.3),
starts at their coordinate-wise median and iterates the gated mean (tau = 1.2) until it moves
less than 1e-4, then prints the mean of c_1 - c* (c* = poolsim.theory.match_limit's 0.13342815)
with its standard error. Cited in docs/tutorials/reproduce-a-figure.md.

    python benchmarks/asymptotic_gap_numpy.py [K:SEEDS ...]   (default 1000:400 10000:400 100000:100)
"""
import sys

import numpy as np

C_STAR = 0.13342815  # theory.match_limit(contaminated(0.3, 1.5, d=2, gamma=0.5), sigma=0.8, tau=1.2, N=150)

rng = np.random.default_rng(1)
for arg in sys.argv[1:] or ["1000:400", "10000:400", "100000:100"]:
    K, S = (int(v) for v in arg.split(":"))
    out = []
    for _ in range(S):
        x = 0.5 * rng.standard_normal((K, 2)) + 0.8 / np.sqrt(150) * rng.standard_normal((K, 2))
        x[:, 0] += 1.5 * (rng.random(K) < 0.3)
        c = np.median(x, axis=0)
        for _ in range(200):
            new = x[((x - c) ** 2).sum(1) < 1.2 ** 2].mean(0)
            moved, c = np.linalg.norm(new - c), new
            if moved < 1e-4:
                break
        out.append(c)
    out = np.array(out)
    print(f"K={K} seeds={S}: c1 - c* = {out[:, 0].mean() - C_STAR:+.5f} +- {out[:, 0].std(ddof=1) / np.sqrt(S):.5f} (SE)")
