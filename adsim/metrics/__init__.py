"""Anomaly-detection metrics: streaming AUROC / AP / F1-max / AUPRO, AUC in percent, map smoothing.

Pure NumPy/SciPy/sklearn (no torch); names load on first use.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['accumulator', 'functional'],
    submod_attrs={
        'accumulator': ['DEFAULT_BINS', 'FPR_LIMIT', 'Accumulator', 'accumulate', 'area_to', 'entries', 'summarize'],
        'functional': ['auc_percent', 'check_sigma', 'smooth'],
    },
)
