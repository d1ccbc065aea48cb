import re

import pytest

from kvstore.config import StoreConfig, parse_bool, parse_bytes
from kvstore.contract.errors import InvalidArgument
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


# ------------------------------------------------------------ environment, flags, renamed keys
def _toml(tmp_path, text: str) -> str:
    path = tmp_path / "kvstore.toml"
    path.write_text(text)
    return str(path)


def test_precedence_is_flag_then_environment_then_file_then_default(tmp_path):
    import argparse

    from kvstore.config import load_config

    path = _toml(tmp_path, "[store]\nio_queue_depth = 4\nmax_disk_bytes = 4096\nread_only = true\n")
    env = {"KVSTORE_IO_QUEUE_DEPTH": "8", "KVSTORE_MAX_DISK_BYTES": "1MiB", "KVSTORE_DATA_DIR": "/env/data"}
    flags = argparse.Namespace(cfg_io_queue_depth=32, cfg_read_only=None)
    cfg = load_config(StoreConfig, path, "store", args=flags, environ=env)
    assert cfg.io_queue_depth == 32  # the flag
    assert cfg.max_disk_bytes == 1 << 20 and cfg.data_dir == "/env/data"  # the environment, units and all
    assert cfg.read_only is True  # the file
    assert cfg.min_free_bytes == StoreConfig().min_free_bytes  # the default
    assert load_config(StoreConfig, path, "store", environ={}).io_queue_depth == 4


def test_every_key_of_both_sections_has_a_variable():
    import dataclasses

    from kvstore.config import env_name, load_config

    server = load_config(ServerConfig, environ={"KVSTORE_ENABLE_ADMIN": "yes", "KVSTORE_LOG_LEVEL": "debug", "KVSTORE_TCP_ADDRESS": ""})
    assert server.enable_admin is True and server.log_level == "debug" and server.tcp_address == ""
    names = [env_name(f.name) for cls in (StoreConfig, ServerConfig) for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) and "KVSTORE_SOCKET_PATH" in names and "KVSTORE_SOCKET" not in names


@pytest.mark.parametrize(
    "cls, var, value, message",
    [
        (StoreConfig, "KVSTORE_IO_QUEUE_DEPTH", "16x", "expected an integer"),
        (StoreConfig, "KVSTORE_IO_QUEUE_DEPTH", "0", "must be positive"),
        (StoreConfig, "KVSTORE_DIRECT_IO", "maybe", "expected true/false"),
        (StoreConfig, "KVSTORE_MAX_READ_RUN_BYTES", "1 GiBs", "byte size"),
        (ServerConfig, "KVSTORE_TCP_ADDRESS", "127.0.0.1:99999", "0-65535"),
        (ServerConfig, "KVSTORE_LOG_LEVEL", "loud", "expected one of debug"),
        (ServerConfig, "KVSTORE_GRACE_SECONDS", "soon", "expected a number"),
    ],
)
def test_a_bad_variable_is_refused_naming_it(cls, var, value, message):
    from kvstore.config import load_config

    with pytest.raises(InvalidArgument) as err:
        load_config(cls, environ={var: value})
    assert err.value.field == var and str(err.value).startswith(f"{var}: ") and message in str(err.value)


def test_a_value_given_as_a_flag_is_not_blamed_on_the_variable():
    import argparse

    from kvstore.config import load_config

    with pytest.raises(InvalidArgument) as err:  # the flag's 0 wins over the variable, so the key is named
        load_config(StoreConfig, args=argparse.Namespace(cfg_io_queue_depth=0), environ={"KVSTORE_IO_QUEUE_DEPTH": "8"})
    assert err.value.field == "io_queue_depth"


def test_renamed_keys_still_load_from_toml_and_both_names_at_once_are_refused(tmp_path):
    from kvstore.config import load_config

    old = _toml(tmp_path, '[server]\ntls_client_ca_file = "ca.pem"\nauth_tokens_file = "t.toml"\ntls_cert_file = "c"\ntls_key_file = "k"\n')
    cfg = load_config(ServerConfig, old, "server", environ={})
    assert (cfg.tls_ca_file, cfg.auth_token_file) == ("ca.pem", "t.toml")
    both = _toml(tmp_path, '[server]\nauth_token_file = "a"\nauth_tokens_file = "b"\n')
    with pytest.raises(InvalidArgument, match="auth_tokens_file: is the old name of auth_token_file"):
        load_config(ServerConfig, both, "server", environ={})


@pytest.mark.parametrize(
    "name, kind, value, shown",
    [
        ("shm_arena_bytes", int, 256 << 20, "256 MiB"),
        ("index_max_map_bytes", int, 1 << 40, "1 TiB"),
        ("shm_slot_bytes", int, 64 << 10, "64 KiB"),
        ("max_disk_bytes", int, 0, "0"),
        ("odd_bytes", int, 4097, "4097 bytes"),
        ("tcp_address", str, "", None),
        ("backend", str, "auto", "auto"),
        ("read_only", bool, False, "false"),
        ("io_queue_depth", int, 16, "16"),
    ],
)
def test_help_shows_defaults_readably(name, kind, value, shown):
    from kvstore.config import format_default

    assert format_default(name, kind, value) == shown


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1", ":7420", "host:port", "[::1]:-1"])
def test_tcp_address_needs_host_and_a_port_in_range(address):
    with pytest.raises(InvalidArgument, match="tcp_address: expected host:port"):
        ServerConfig(tcp_address=address, auth_token_file="t")
    assert ServerConfig(tcp_address="[::1]:0", auth_token_file="t").tcp_address == "[::1]:0"


def test_auth_token_file_takes_one_token_or_a_table_of_them(tmp_path):
    from kvstore.server.auth import read_auth_token_file

    one = tmp_path / "token"
    one.write_text("0123456789abcdef0123+/==\n")  # base64 padding is part of a token
    assert read_auth_token_file(str(one)) == {"0123456789abcdef0123+/==": None}
    table = tmp_path / "tokens.toml"
    table.write_text('[tokens]\n"tenant-a-token-0123456789" = ["a"]\n"operator-token-0123456789" = ["*"]\n')
    assert read_auth_token_file(str(table)) == {"tenant-a-token-0123456789": frozenset({"a"}), "operator-token-0123456789": None}
    for text, message in (("short\n", "shorter than"), ("[tokens\nx", "neither one token nor"), ("a = 1\n", "needs a [tokens] table")):
        table.write_text(text)
        with pytest.raises(InvalidArgument, match=f"auth_token_file: .*{re.escape(message)}"):
            read_auth_token_file(str(table))


@pytest.mark.parametrize(
    "fields, key",
    [
        ({"merge_min_segments": -1}, "merge_min_segments"),
        ({"merge_min_segments": 1}, "merge_min_segments"),
        ({"merge_small_segment_bytes": 0}, "merge_small_segment_bytes"),
        ({"merge_max_bytes": 0}, "merge_max_bytes"),
        ({"merge_small_segment_bytes": 4 << 20, "merge_max_bytes": 6 << 20}, "merge_max_bytes"),
    ],
)
def test_bad_merge_settings_are_refused_naming_the_key(fields, key):
    with pytest.raises(InvalidArgument) as err:
        StoreConfig(**fields)
    assert err.value.field == key and "\n" not in str(err.value)
    assert StoreConfig(merge_min_segments=0).merge_min_segments == 0  # off
