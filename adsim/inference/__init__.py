"""Inference: ``Detector`` -- the one path from images to anomaly scores and maps -- overlays, and the
prediction report (scores.csv, report.html).
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['detector', 'overlays', 'report', 'scoring'],
    submod_attrs={
        'detector': ['BatchScores', 'Detector', 'Prediction', 'Run', 'UnreadableImageWarning', 'load_run', 'record', 'volume_rows'],
        'report': ['csv_rows', 'write_report', 'write_scores_csv'],
        'scoring': ['run_score', 'score', 'score_batches'],
        'overlays': ['overlay', 'write_overlay'],
    },
)
