"""Detection methods behind one contract (:class:`Method` -> :class:`Output`) and their public registry.

A method of your own: subclass :class:`Method` and call :func:`register_zero_shot` (training-free),
or :func:`register_trainer` plus :func:`register_trained` (trained by ``python -m adsim train``);
the built-in baselines (``adsim.methods.baselines``) register themselves the same way.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['baselines', 'catalog', 'fewshot', 'registry'],
    submod_attrs={
        'registry': ['HeadMethod', 'Method', 'Output', 'Trainer', 'register_trained', 'register_trainer', 'register_zero_shot'],
        'catalog': ['trained', 'trainer', 'zero_shot', 'zero_shot_names'],
        'fewshot': ['FewShot'],
    },
)
