"""Start-up of real daemon processes: configuration errors and socket ownership."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile

import pytest
from daemon import DaemonProcess
from helpers import data_root

from engine_client.client import KVStoreClient

TOKEN = "0123456789abcdef-token"


def refused(d: DaemonProcess) -> subprocess.CompletedProcess:
    """Run the daemon's command line to completion (it is expected to refuse)."""
    return subprocess.run(d.args, env=d.env, cwd=data_root(), capture_output=True, text=True, timeout=60)


def assert_one_line_refusal(res: subprocess.CompletedProcess, name: str, status: int = 2) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == status, res.stderr
    assert len(lines) == 1 and name in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def _bad_configs(tmp_path):
    (tmp_path / "short").write_text("short\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    toml = {  # case: (file text, the key the error must name)
        "syntax": ("[store\n", "--config"),
        "bool-as-string": ('[store]\nread_only = "no"\n', "read_only"),
        "direct-io-string": ('[store]\ndirect_io = "false"\n', "direct_io"),
        "int-as-string": ('[store]\nio_queue_depth = "16"\n', "io_queue_depth"),
        "unknown-key": ("[server]\nshm_arena_byte = 1\n", "shm_arena_byte"),
        "bad-unit": ('[server]\nshm_arena_bytes = "1 GiBs"\n', "shm_arena_bytes"),
        "both-names": (f'[server]\nauth_token_file = "{tmp_path}/token"\nauth_tokens_file = "{tmp_path}/token"\n', "auth_tokens_file"),
    }
    cases = {}
    for case, (text, name) in toml.items():
        (tmp_path / f"{case}.toml").write_text(text)
        cases[case] = (("--config", str(tmp_path / f"{case}.toml")), name)
    tcp = ("--tcp-address", "127.0.0.1:0")
    cases.update(
        {
            "flag-bool": (("--direct-io", "maybe"), "--direct-io"),
            "flag-int": (("--io-queue-depth", "16x"), "--io-queue-depth"),
            "flag-unit": (("--shm-arena-bytes", "1XiB"), "--shm-arena-bytes"),
            "port-out-of-range": (("--tcp-address", "127.0.0.1:99999", "--auth-token-file", str(tmp_path / "token")), "--tcp-address"),
            "both-names": (("--config", str(tmp_path / "both-names.toml")), "auth_tokens_file"),
            "short-token": ((*tcp, "--auth-token-file", str(tmp_path / "short")), "auth_token_file"),
            "missing-token": ((*tcp, "--auth-token-file", str(tmp_path / "absent")), "auth_token_file"),
            "missing-tls": ((*tcp, "--tls-cert-file", str(tmp_path / "c.pem"), "--tls-key-file", str(tmp_path / "k.pem")), "tls_key_file"),
            "port-in-use": (
                ("--tcp-address", f"127.0.0.1:{busy.getsockname()[1]}", "--auth-token-file", str(tmp_path / "token")),
                "tcp_address",
            ),
        }
    )
    return cases, busy


BAD = [
    "syntax",
    "bool-as-string",
    "direct-io-string",
    "int-as-string",
    "unknown-key",
    "bad-unit",
    "flag-bool",
    "flag-int",
    "flag-unit",
    "port-out-of-range",
    "both-names",
    "short-token",
    "missing-token",
    "missing-tls",
    "port-in-use",
]


@pytest.mark.parametrize("case", BAD)
def test_configuration_error_is_one_line_exit_2_and_nothing_listens(daemon_factory, tmp_path, case):
    cases, busy = _bad_configs(tmp_path)
    args, name = cases[case]
    with busy:
        d = daemon_factory(*args, start=False)
        res = refused(d)
    assert_one_line_refusal(res, name)
    assert not os.path.exists(d.socket) and not os.path.exists(d.socket + ".shm")
    assert not os.path.exists(tmp_path / "data")  # the store was not opened either


def test_byte_sizes_take_units_from_flags_and_toml(daemon_factory, tmp_path):
    (tmp_path / "units.toml").write_text('[store]\nmax_read_run_bytes = "4MiB"\n')
    d = daemon_factory("--config", str(tmp_path / "units.toml"), "--shm-arena-bytes", "16MiB", "--direct-io", "no")
    with KVStoreClient(d.target) as client:
        assert client.stats().shm_arena_bytes == 16 << 20


def test_live_daemon_keeps_its_socket(daemon_factory, tmp_path):
    first = daemon_factory()
    second = daemon_factory("--socket-path", first.socket, data_dir=tmp_path / "other", start=False)
    res = refused(second)
    assert_one_line_refusal(res, "socket_path")
    assert f"pid {first.proc.pid}" in res.stderr
    with KVStoreClient(first.target) as client:
        assert client.shm and client.stats().num_prefixes == 0  # both sockets still the first daemon's


def test_regular_file_at_socket_path_is_refused_and_kept(daemon_factory):
    d = daemon_factory(start=False)
    os.makedirs(os.path.dirname(d.socket))
    with open(d.socket, "w") as fh:
        fh.write("not a socket")
    assert_one_line_refusal(refused(d), "socket_path")
    with open(d.socket) as fh:
        assert fh.read() == "not a socket"


def test_existing_run_directory_keeps_its_mode_and_a_stale_socket_is_replaced(daemon_factory):
    d = daemon_factory(start=False)
    run_dir = os.path.dirname(d.socket)
    os.makedirs(run_dir)
    os.chmod(run_dir, 0o1777)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(d.socket)  # bound, never listening, closed: what a killed daemon leaves
    stale.close()
    d.start()
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o1777
    with KVStoreClient(d.target) as client:
        assert client.stats().num_prefixes == 0


def test_created_run_directory_is_0750(daemon):
    assert stat.S_IMODE(os.stat(os.path.dirname(daemon.socket)).st_mode) == 0o750


def test_exit_removes_only_a_socket_that_is_still_its_own(daemon_factory, tmp_path):
    first = daemon_factory()
    os.unlink(first.socket)  # an operator removed it; the path is free for another daemon
    os.unlink(first.socket + ".shm")
    second = daemon_factory("--socket-path", first.socket, data_dir=tmp_path / "other")
    assert first.stop() == 0
    assert os.path.exists(first.socket) and os.path.exists(first.socket + ".shm")
    with KVStoreClient(first.target) as client:  # the path the second daemon serves on
        assert client.shm and client.stats().num_prefixes == 0
    assert second.proc.poll() is None


# ------------------------------------------------------------ the environment, start-up errors, readiness
def test_environment_overrides_the_file_and_a_flag_overrides_the_environment(daemon_factory, tmp_path):
    (tmp_path / "arena.toml").write_text('[server]\nshm_arena_bytes = "8MiB"\n')
    env = {"KVSTORE_SHM_ARENA_BYTES": "16MiB", "KVSTORE_MAX_DISK_BYTES": "1GiB"}
    d = daemon_factory("--config", str(tmp_path / "arena.toml"), env=env, start=False)
    i = d.args.index("--shm-arena-bytes")
    del d.args[i : i + 2]  # the helper's own flag: here the variable is to decide
    d.start()
    with KVStoreClient(d.target) as client:
        st = client.stats()
    assert st.shm_arena_bytes == 16 << 20 and st.max_disk_bytes == 1 << 30  # the variables over the file
    flagged = daemon_factory("--shm-arena-bytes", "4MiB", data_dir=tmp_path / "d2", env=env)
    with KVStoreClient(flagged.target) as client:
        assert client.stats().shm_arena_bytes == 4 << 20


@pytest.mark.parametrize(
    "var, value", [("KVSTORE_IO_QUEUE_DEPTH", "16x"), ("KVSTORE_DIRECT_IO", "maybe"), ("KVSTORE_TCP_ADDRESS", "127.0.0.1:99999")]
)
def test_a_bad_variable_is_one_line_naming_it_and_nothing_listens(daemon_factory, tmp_path, var, value):
    d = daemon_factory(start=False, env={var: value})
    res = refused(d)
    assert_one_line_refusal(res, var)
    assert not os.path.exists(d.socket) and not os.path.exists(tmp_path / "data")


def test_a_data_dir_it_cannot_use_is_one_line_naming_data_dir(daemon_factory, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    d = daemon_factory(data_dir=tmp_path / "file" / "data", start=False)
    res = refused(d)
    assert_one_line_refusal(res, f"data_dir: {tmp_path / 'file'}: ", status=1)
    assert "Errno" not in res.stderr and "cannot start" in res.stderr
    assert not os.path.exists(d.socket)


def test_a_data_dir_another_daemon_holds_is_one_line_naming_data_dir(daemon_factory, tmp_path):
    first = daemon_factory()
    second = daemon_factory(data_dir=first.data_dir, start=False)
    res = refused(second)
    assert_one_line_refusal(res, f"data_dir: {first.data_dir}", status=1)
    assert not os.path.exists(second.socket)
    with KVStoreClient(first.target) as client:
        assert client.stats().num_prefixes == 0


def test_systemd_is_told_ready_once_serving_and_stopping_when_draining(daemon_factory, tmp_path):
    path = os.path.join(tempfile.mkdtemp(prefix="kvn", dir="/tmp"), "notify")  # short: sun_path limit
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(30)
        d = daemon_factory(env={"NOTIFY_SOCKET": path})
        assert sock.recv(64) == b"READY=1"
        with KVStoreClient(d.target) as client:  # ready means serving
            assert client.stats().num_prefixes == 0
        assert d.stop() == 0
        assert sock.recv(64) == b"STOPPING=1"
    os.unlink(path)
