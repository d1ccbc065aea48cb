"""Which mode kvikio reads in, asked across its releases: compatibility mode means POSIX through the page cache."""

import enum
from types import SimpleNamespace

from kvstore.io.kvikio_backend import compat_mode


class CompatMode(enum.Enum):
    OFF = 0
    ON = 1
    AUTO = 2


def lib(**defaults):
    return SimpleNamespace(defaults=SimpleNamespace(**defaults))


def test_the_file_is_asked_first():
    kvikio = lib(is_compat_mode_preferred=lambda: True)
    assert compat_mode(kvikio, SimpleNamespace(is_compat_mode_preferred=lambda: False)) is False
    assert compat_mode(kvikio, SimpleNamespace()) is True


def test_each_release_spelling():
    assert compat_mode(lib(is_compat_mode_preferred=lambda: False)) is False
    assert compat_mode(lib(compat_mode=lambda: True)) is True  # older releases: a bool
    assert compat_mode(lib(compat_mode=lambda: CompatMode.OFF)) is False
    assert compat_mode(lib(compat_mode=lambda: CompatMode.ON)) is True
    assert compat_mode(lib(compat_mode=lambda: CompatMode.AUTO)) is True  # not resolved: assume POSIX


def test_unknown_or_failing_queries_assume_posix():
    def broken():
        raise RuntimeError("not in this release")

    assert compat_mode(lib()) is True
    assert compat_mode(lib(is_compat_mode_preferred=broken)) is True
    assert compat_mode(lib(is_compat_mode_preferred=broken, compat_mode=lambda: False)) is False
