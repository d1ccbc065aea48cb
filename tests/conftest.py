import pytest
from helpers import HAS_CUDA

from kvstore.config import StoreConfig


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA driver (libcuda.so.1) and kvikio")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture
def store_config(tmp_path) -> StoreConfig:
    return StoreConfig(data_dir=str(tmp_path / "data"), min_free_bytes=0, index_map_bytes=1 << 20)
