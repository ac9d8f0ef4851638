"""Training: the loop, the compiled step, the frozen-trunk cache and model selection.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['cache', 'compiled_step'],
    submod_attrs={
        'train': ['make_optimizer', 'selection_score', 'train', 'train_epoch'],
        'cache': ['build_trunk_cache'],
    },
)
