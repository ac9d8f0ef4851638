"""The feature-level simulator's parameters (plain Python: the CLI lists them without loading torch)."""
from __future__ import annotations

from typing import NamedTuple


class SimParams(NamedTuple):
    """Parameters of the feature-level simulator (``adsim.data.sim.simulate``): token and embedding sizes,
    the patch grid and the heterogeneity of the SIMULATED modalities; each field's comment says its role."""
    width: int = 32                 # W: frozen token dimension (adapter input)
    embed_dim: int = 16             # E: adapter bottleneck = text embedding dimension (>= class_channels)
    class_channels: int = 8         # C: channels carrying the anomaly shift (>= 7 with couple_anomalies)
    grid: int = 6                   # patches per side
    n_layers: int = 4               # adapter layers (as the reference head)
    n_train: int = 24               # images per class per domain for training
    n_test: int = 1000              # per class per domain: AUC standard error <= 1.3 points (Hanley-McNeil, AUC 0.5)
    patch_cos: float = 0.8          # cosine between a patch token and its image feature
    anomaly_shift: float = 0.45     # length of the shift added to a lesion patch (unit tokens)
    shared: float = 0.5             # m: mean text alignment a_k (energy of v_k on the shared text direction)
    align_concentration: float = 2.0  # kappa: a_k ~ Beta(kappa m, kappa (1 - m)); inf = a_k = m exactly
    couple_anomalies: bool = True   # modality-specific anomaly directions correlated like the modalities
    offdiag_scale: float = 1.0      # s in G(s) = s G + (1 - s) diag(G); 1 = paper Table 4
    lesion_radius: tuple = (0.8, 1.8)  # blob radius range in patches
    text_cos: float = 0.8           # cosine between the normal and the anomaly text embedding


# The simulator parameters the sensitivity sweep varies (one at a time, around the defaults).
SWEEP = {"shared": (0.0, 0.5, 1.0), "align_concentration": (2.0, float("inf")),
         "anomaly_shift": (0.3, 0.45, 0.6), "offdiag_scale": (0.5, 1.0)}
