"""torch for poolsim's test files that also check the torch path (``from optional_torch import torch,
needs_torch``). The jobs of ``.ci/run`` that test poolsim alone (at its dependency floors, on other
Pythons) install it without the adsim extra: there ``torch`` is None and the torch cases skip, saying
why; wherever the extra is installed (the README's test command) they run."""
import pytest

try:
    import torch
except ModuleNotFoundError:  # only a missing torch skips: a torch that fails to import is an error
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason='torch is not installed (the adsim extra: '
                                 'pip install -e ".[adsim]")')
