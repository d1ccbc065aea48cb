import pytest
from daemon import DaemonProcess

from engine_client.client import KVStoreClient

# The model fixtures import torch where they are used: the daemon's tests also run on an install without it.


@pytest.fixture
def daemon_factory(tmp_path):
    started = []

    def make(*extra, data_dir=None, start=True, env=None):
        d = DaemonProcess(str(data_dir or tmp_path / "data"), *extra, env=env)
        started.append(d)
        return d.start() if start else d

    yield make
    for d in started:
        d.cleanup()


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The 2-layer random ``tiny`` checkpoint (kvstore_tools.make_checkpoint), float32."""
    import torch

    from engine_client.model.loader import load_checkpoint
    from kvstore_tools.make_checkpoint import make_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return load_checkpoint(str(path), dtype=torch.float32)


@pytest.fixture
def tiny_runner(daemon, tiny_model):
    """A ModelRunner of ``tiny_model`` on a fresh daemon, one-layer stored groups, full-precision probe keys."""
    from engine_client.reprefill import ModelRunner

    with KVStoreClient(daemon.target) as client:
        yield ModelRunner(tiny_model, client, group_layers=1, probe_bits=0)  # probe keys stored in the KV dtype
