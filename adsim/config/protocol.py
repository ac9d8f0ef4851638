"""The domain-addition protocol's named method variants, domain orders and modes (plain Python)."""
from __future__ import annotations

# protocol method name -> the recipe fields it overrides; "continual": how a method adds a domain when it
# does not follow the run's mode ("bilora": step i trains only domain i's BiLoRA update on step i-1's head,
# adsim.methods.baselines.bilora, whatever the mode)
METHODS = {
    "naive": dict(method="naive", metric="geodesic", vaca=False),
    "match-l2": dict(method="match", metric="l2", vaca=False),
    "match-cosine": dict(method="match", metric="cosine", vaca=False),
    "match-geodesic": dict(method="match", metric="geodesic", vaca=False),
    "match-geodesic-vaca": dict(method="match", metric="geodesic", vaca=True),
    "bilora": dict(method="naive", metric="geodesic", vaca=False, continual="bilora"),
}
ORDERS = ("hardest", "reverse", "random")
MODES = ("cumulative", "sequential")
