"""One name per thing across the command lines; every older spelling is a hidden alias that still works."""

import subprocess
import sys

import pytest
from helpers import data_root

from kvstore import __version__
from kvstore.cli_flags import find_socket
from tools.admin import build_parser as admin_parser
from tools.bench.cli import build_parser as bench_parser
from tools.demo import build_parser as demo_parser


def bench(argv):
    return bench_parser(argv).parse_args(argv)


# (parse, argv with the old spelling, attribute, expected value)
ALIASES = [
    ("admin --socket", lambda a: admin_parser().parse_args(a), ["--socket", "/s", "ls"], "socket_path", "/s"),
    ("admin --socket after the command", lambda a: admin_parser().parse_args(a), ["ls", "--socket", "/s"], "socket_path", "/s"),
    ("admin --token-file", lambda a: admin_parser().parse_args(a), ["--token-file", "t", "ls"], "auth_token_file", "t"),
    ("demo --target", lambda a: demo_parser().parse_args(a), ["--target", "unix:/r/s"], "target", "unix:/r/s"),
    ("demo --budget", lambda a: demo_parser().parse_args(a), ["--budget", "0.1", "--budget", "0.5"], "budgets", [0.1, 0.5]),
    ("bench io --directory", bench, ["io", "--directory", "/d"], "directory", "/d"),
    ("bench io --budget", bench, ["io", "--chunked", "--budget", "0.1", "--budget", "0.2"], "budget", [0.1, 0.2]),
    ("bench io --io-queue-depth", bench, ["io", "--io-queue-depth", "3"], "iodepth", 3),
    ("bench reprefill --target", bench, ["reprefill", "--target", "unix:/r/s"], "target", "unix:/r/s"),
    ("bench reprefill --directory", bench, ["reprefill", "--directory", "/d"], "directory", "/d"),
    ("bench reprefill --iodepth", bench, ["reprefill", "--iodepth", "5"], "iodepth", 5),
    ("bench accuracy --directory", bench, ["accuracy", "--task", "kv-recall", "--path", "full", "--directory", "/d"], "directory", "/d"),
]
# the same things under their one name
NAMES = [
    (lambda a: admin_parser().parse_args(a), ["--socket-path", "/s", "ls"], "socket_path", "/s"),
    (lambda a: admin_parser().parse_args(a), ["--auth-token-file", "t", "ls"], "auth_token_file", "t"),
    (lambda a: demo_parser().parse_args(a), ["--budgets", "0.1,0.5"], "budgets", [0.1, 0.5]),
    (bench, ["io", "--data-dir", "/d"], "directory", "/d"),
    (bench, ["io", "--chunked", "--budgets", "0.1,0.2"], "budget", [0.1, 0.2]),
    (bench, ["reprefill", "--socket-path", "/r/s"], "target", "unix:/r/s"),
    (bench, ["reprefill", "--data-dir", "/d"], "directory", "/d"),
    (bench, ["reprefill", "--io-queue-depth", "5"], "iodepth", 5),
]


@pytest.mark.parametrize("parse, argv, attr, want", [a[1:] for a in ALIASES], ids=[a[0] for a in ALIASES])
def test_old_spelling_is_a_working_alias(parse, argv, attr, want):
    if "accuracy" in argv:
        from engine_client.tasks import TASKS

        argv = [a if a != "kv-recall" else next(iter(TASKS)) for a in argv]
    assert getattr(parse(argv), attr) == want


@pytest.mark.parametrize("parse, argv, attr, want", NAMES)
def test_one_name_per_thing(parse, argv, attr, want):
    assert getattr(parse(argv), attr) == want


def test_aliases_are_hidden_from_help():
    text = admin_parser().format_help() + bench_parser(["io"])._subparsers._group_actions[0].choices["io"].format_help()
    for old in ("--socket ", "--token-file", "--directory", "--budget ", "--io-queue-depth"):
        assert old not in text, old
    assert "--socket-path" in text and "--auth-token-file" in text and "--data-dir" in text and "--budgets" in text


def test_defaults_unchanged_without_aliases():
    a = bench(["io"])
    assert a.directory == ".kvstore/bench" and a.iodepth == 16 and a.budget is None
    assert demo_parser().parse_args([]).budgets == [0.05, 0.25, 1.0]
    assert demo_parser().parse_args([]).target is None


@pytest.mark.parametrize(
    "module, argv",
    [("kvstore.cli", []), ("kvstore.cli", ["serve"]), ("tools.demo", []), ("tools.admin", []), ("tools.bench.cli", [])],
    ids=["kvstore", "serve", "demo", "admin", "bench"],
)
def test_version_everywhere(module, argv):
    proc = subprocess.run([sys.executable, "-m", module, *argv, "--version"], cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert __version__ in proc.stdout


def test_bench_help_imports_no_torch():
    code = (
        "import sys\n"
        "from tools.bench.cli import build_parser\n"
        "p = build_parser(['--help']); p.format_help(); build_parser(['io', '--help'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert {'io', 'reprefill', 'accuracy'} <= set(p._subparsers._group_actions[0].choices)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_daemon_and_admin_import_no_torch():
    code = "import sys, kvstore.server.app, kvstore.server.main, tools.admin, engine_client.client\nassert 'torch' not in sys.modules\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_socket_discovery_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / ".kvstore" / "run" / "kvstore.sock"
    path, looked = find_socket({"KVSTORE_SOCKET": str(tmp_path / "nope")})
    if path is None:  # nothing at the system path on this machine
        assert looked == (
            f"looked at {tmp_path / 'nope'} ($KVSTORE_SOCKET), /run/kvstore/kvstore.sock (system default), {local} (this directory)"
        )
    local.parent.mkdir(parents=True)
    local.touch()
    env_sock = tmp_path / "env.sock"
    env_sock.touch()
    assert find_socket({"KVSTORE_SOCKET": str(env_sock)})[0] == str(env_sock)  # the variable first
    assert find_socket({})[0] in ("/run/kvstore/kvstore.sock", str(local))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
@pytest.mark.parametrize(
    "module, argv",
    [("tools.admin", ["--timeout", "V", "ls"]), ("tools.admin", ["ls", "--timeout", "V"]), ("kvstore.cli", ["health", "--timeout", "V"])],
)
def test_a_timeout_that_is_not_positive_seconds_is_refused_in_one_line(module, argv, value):
    argv = [value if a == "V" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --timeout: " in proc.stderr.strip().splitlines()[-1] and repr(value) in proc.stderr


def test_admin_takes_its_timeout_before_or_after_the_command():
    assert admin_parser().parse_args(["--timeout", "2.5", "ls"]).timeout == 2.5
    assert admin_parser().parse_args(["ls", "--timeout", "2.5"]).timeout == 2.5
    assert admin_parser().parse_args(["ls"]).timeout == 600.0
