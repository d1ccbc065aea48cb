import pytest

from kvstore.config import StoreConfig, parse_bool, parse_bytes
from kvstore.errors import InvalidArgument
from kvstore.server.config import ServerConfig


@pytest.mark.parametrize(
    "text, value",
    [
        ("4096", 4096),
        ("64k", 64 << 10),
        ("64KiB", 64 << 10),
        ("512MiB", 512 << 20),
        ("1GiB", 1 << 30),
        ("1gb", 10**9),
        ("2TiB", 2 << 40),
        ("3 MB", 3 * 10**6),
        ("1M", 1 << 20),
    ],
)
def test_byte_sizes_take_binary_and_si_units(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "1.5GiB", "GiB", "-1", "1 GiBs", "1e9"])
def test_bad_byte_size_is_refused(text):
    with pytest.raises(ValueError, match="byte size"):
        parse_bytes(text)


def test_booleans_are_words_or_digits_only():
    assert [parse_bool(t) for t in ("true", "YES", "1", "false", "no", "0")] == [True, True, True, False, False, False]
    with pytest.raises(ValueError):
        parse_bool("off-ish")


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (StoreConfig, "read_only", "no"),
        (StoreConfig, "direct_io", "false"),
        (StoreConfig, "io_queue_depth", "16"),
        (StoreConfig, "io_queue_depth", True),
        (StoreConfig, "data_dir", 3),
        (ServerConfig, "grace_seconds", "1"),
    ],
)
def test_every_field_is_type_checked_and_named(cls, field, value):
    with pytest.raises(InvalidArgument, match=field):
        cls(**{field: value})
