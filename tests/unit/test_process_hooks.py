"""What the daemon process does around its work: log lines of native code, systemd readiness, fault-injection switch."""

import json
import socket
import subprocess
import sys

from helpers import data_root

from kvstore.server.notify import notify


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=data_root(), env=env, capture_output=True, text=True, timeout=60)


def test_json_logs_turn_native_stderr_lines_into_events():
    code = (
        "import logging, os, sys\n"
        "from kvstore import logs\n"
        "logs.configure('json', 'info')\n"
        "assert os.environ['GRPC_VERBOSITY'] == 'ERROR' and os.environ['GRPC_TRACE'] == ''\n"
        "os.write(2, b'E1127 13:23:19.115024    4106 add_port.cc:83] Failed to add port\\n')\n"
        "os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n')\n"
        "logging.getLogger('kvstore.x').info('python line')\n"
        "print('a plain print', file=sys.stderr)\n"
        "logs.close()\n"
        "os.write(2, b'after close\\n')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[-1] == "after close" and "a plain print" in lines  # Python's own writes skip the pipe
    events = [json.loads(line) for line in lines if line not in ("after close", "a plain print")]
    by_msg = {e["msg"]: e for e in events}
    assert by_msg["Failed to add port (add_port.cc:83)"]["level"] == "ERROR"
    assert by_msg["Failed to add port (add_port.cc:83)"]["logger"] == "grpc"
    assert any(e["level"] == "WARNING" and "absl::InitializeLog" in e["msg"] for e in events)
    assert by_msg["python line"]["logger"] == "kvstore.x"


def test_grpc_verbosity_follows_the_level_and_an_operators_choice_stays():
    code = "import os\nfrom kvstore import logs\nlogs.configure('text', 'debug')\nprint(os.environ['GRPC_VERBOSITY'])\n"
    assert run_python(code).stdout.strip() == "INFO"
    env = {"PYTHONPATH": data_root(), "GRPC_VERBOSITY": "DEBUG", "PATH": "/usr/bin:/bin"}
    assert run_python(code.replace("'debug'", "'error'"), env=env).stdout.strip() == "DEBUG"


def test_notify_sends_one_datagram_to_notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert notify("READY=1", {"NOTIFY_SOCKET": path}) is True
        assert sock.recv(64) == b"READY=1"
    assert notify("READY=1", {}) is False  # not under systemd: nothing to do


def test_notify_to_an_abstract_socket_and_to_nobody(tmp_path):
    name = f"kvstore-test-{id(tmp_path)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(64) == b"STOPPING=1"
    assert notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False  # logged, never fatal


def test_fault_variables_do_nothing_without_the_switch():
    code = "from kvstore import faults\nprint(faults.armed('put:opened'), faults.IGNORED, flush=True)\nfaults.crash_point('put:opened')\nprint('alive')\n"
    base = {"PYTHONPATH": data_root(), "PATH": "/usr/bin:/bin", "KVSTORE_CRASH_AT": "put:opened"}
    off = run_python(code, env=base)
    assert off.returncode == 0 and off.stdout.split("\n")[:2] == ["False ('KVSTORE_CRASH_AT',)", "alive"]
    on = run_python(code, env={**base, "KVSTORE_FAULTS": "1"})
    assert on.returncode == -9 and on.stdout.startswith("True ()")  # SIGKILLed at the step
