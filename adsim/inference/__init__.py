"""Inference: ``Detector`` -- the one path from images to anomaly scores and maps -- and overlays.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['detector', 'overlays', 'scoring'],
    submod_attrs={
        'detector': ['Detector', 'Prediction', 'Run', 'UnreadableImageWarning', 'load_run'],
        'scoring': ['run_score', 'score', 'score_batches'],
        'overlays': ['overlay', 'write_overlay'],
    },
)
