import pytest
from daemon import DaemonProcess


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
