import ctypes
import pytest

from kvstore.config import StoreConfig


def _has_cuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


HAS_CUDA = _has_cuda()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA driver (libcuda.so.1) and kvikio")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture
def store_config(tmp_path) -> StoreConfig:
    return StoreConfig(data_dir=str(tmp_path / "data"), min_free_bytes=0, index_map_bytes=1 << 20)
