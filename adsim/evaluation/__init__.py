"""Evaluation of a run folder on a BMAD target: ``RUN/metrics.json``.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=[],
    submod_attrs={
        'evaluate': ['evaluate', 'evaluate_zero_shot', 'split_metrics', 'write_extremes'],
    },
)
