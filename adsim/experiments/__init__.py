"""Experiments: the domain-addition protocol, parameter sweeps, the Table 1 runner and AD figures.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['figures', 'protocol', 'sources', 'sweep', 'table'],
    submod_attrs={
    },
)
