"""adsim test set-up: one torch thread (the CI machine is small and shared), a session toy data set
and a session tiny backbone (random weights -- its RandomWeightsWarning is expected here)."""
import warnings

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from adsim.data.toy import make_toy_bmad  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone  # noqa: E402


@pytest.fixture(scope="session")
def toy_root(tmp_path_factory):
    # 2 normal + 2 anomalous images per domain and split: 40 training images for one target
    return make_toy_bmad(tmp_path_factory.mktemp("toy_bmad"), n_per_class=2, size=64, seed=1)


@pytest.fixture(scope="session")
def tiny():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        return build_backbone("tiny", seed=0)
