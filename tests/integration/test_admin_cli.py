"""kvstore-admin against a real daemon: finding it, a daemon without admin calls, a closed pipe."""

import json
import os
import subprocess
import sys

from helpers import GEOMETRIES, data_root, make_kv, make_tokens

from engine_client.client import KVStoreClient


def admin(*argv, cwd=None, env=None):
    env = {**{k: v for k, v in os.environ.items() if k != "KVSTORE_SOCKET"}, "PYTHONPATH": data_root(), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kvstore_tools.admin", *argv], cwd=cwd or data_root(), env=env, capture_output=True, text=True, timeout=120
    )


def put_one(daemon):
    geo = GEOMETRIES[2]
    with KVStoreClient(daemon.target) as client:
        return client.put_prefix(make_tokens(40, 1), make_kv(geo, 40, 1), geo).prefix_id


def test_finds_the_daemon_from_kvstore_socket(daemon, tmp_path):
    pid = put_one(daemon)
    proc = admin("--json", "ls", cwd=tmp_path, env={"KVSTORE_SOCKET": daemon.socket})
    assert proc.returncode == 0, proc.stderr
    assert [p["prefix_id"] for p in json.loads(proc.stdout)] == [pid]


def test_says_where_it_looked_when_nothing_is_found(tmp_path):
    missing = str(tmp_path / "no.sock")
    proc = admin("ls", cwd=tmp_path, env={"KVSTORE_SOCKET": missing})
    if os.path.exists("/run/kvstore/kvstore.sock"):
        return  # a system daemon would answer here
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"looked at {missing} ($KVSTORE_SOCKET), /run/kvstore/kvstore.sock (system default)" in line
    assert f"{tmp_path}/.kvstore/run/kvstore.sock (this directory)" in line
    assert "--socket-path, --tcp-address or --data-dir" in line


def test_named_socket_that_is_missing_names_the_flag(tmp_path):
    proc = admin("--socket-path", str(tmp_path / "x.sock"), "ls")
    assert proc.returncode == 1 and "--socket-path" in proc.stderr and "Traceback" not in proc.stderr


def test_admin_call_on_a_daemon_without_admin_says_so(daemon_factory):
    d = daemon_factory("--no-enable-admin")
    pid = put_one(d)
    for argv in (["inspect", pid], ["verify", "--all"], ["compact"]):
        proc = admin("--socket-path", d.socket, *argv)
        assert proc.returncode == 1
        assert "does not serve admin calls" in proc.stderr and "start it with --enable-admin " in proc.stderr, proc.stderr
        assert "Method not found" not in proc.stderr and "Traceback" not in proc.stderr
    assert admin("--socket-path", d.socket, "ls").returncode == 0  # the data service is there


def test_ls_json_into_a_closed_pipe_ends_quietly(daemon):
    for i in range(3):
        geo = GEOMETRIES[2]
        with KVStoreClient(daemon.target) as client:
            client.put_prefix(make_tokens(40, 10 + i), make_kv(geo, 40, 10 + i), geo)
    env = {**os.environ, "PYTHONPATH": data_root()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstore_tools.admin", "--socket-path", daemon.socket, "ls", "--json"],
        cwd=data_root(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before anything is written, as `| head` leaves it
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_ls_json_piped_to_head_prints_one_line(daemon):
    put_one(daemon)
    cmd = f"{sys.executable} -m kvstore_tools.admin --socket-path {daemon.socket} ls --json | head -1"
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd],
        cwd=data_root(),
        env={**os.environ, "PYTHONPATH": data_root()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout == "[\n" and proc.stderr == "", proc.stderr


def test_kvstore_health_probe(daemon, tmp_path):
    def health(path):
        return subprocess.run(
            [sys.executable, "-m", "kvstore.cli", "health", "--socket-path", path, "--timeout", "5"],
            cwd=data_root(),
            env={**os.environ, "PYTHONPATH": data_root()},
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = health(daemon.socket)
    assert ok.returncode == 0 and ok.stdout.strip() == "SERVING", ok.stderr
    daemon.stop()
    gone = health(daemon.socket)
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stderr and "Traceback" not in gone.stderr


def test_admin_reaches_a_tcp_daemon_by_tcp_address_and_by_its_old_name(daemon_factory, tmp_path):
    token = tmp_path / "token"
    token.write_text("0123456789abcdef-admin-token\n")
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-token-file", str(token))
    pid = put_one(d)
    address = f"127.0.0.1:{d.tcp_port}"
    for flag in ("--tcp-address", "--address"):
        proc = admin(flag, address, "--auth-token-file", str(token), "ls", "--json")
        assert proc.returncode == 0, proc.stderr
        assert [p["prefix_id"] for p in json.loads(proc.stdout)] == [pid]
