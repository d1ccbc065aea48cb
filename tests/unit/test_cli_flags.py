"""One name per thing across the command lines; every older spelling is a hidden alias that still works."""

import os
import subprocess
import sys

import pytest
from helpers import data_root

from kvstore import __version__
from kvstore.cli import build_parser as kvstore_parser
from kvstore.cli_flags import default_socket, find_socket
from kvstore.server.config import ServerConfig
from kvstore_tools.admin import build_parser as admin_parser
from kvstore_tools.bench.cli import build_parser as bench_parser
from kvstore_tools.demo import build_parser as demo_parser


def bench(argv):
    return bench_parser(argv).parse_args(argv)


def serve(argv):
    return kvstore_parser().parse_args(["serve", *argv])


def run_cli(module, *argv, env=None):
    env = {k: v for k, v in (env if env is not None else os.environ).items()}
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=data_root(), env=env, capture_output=True, text=True, timeout=60)


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
    ("bench restore --directory", bench, ["restore", "--directory", "/d"], "directory", "/d"),
    ("bench io --max-read-run", bench, ["io", "--chunked", "--max-read-run", "64k"], "max_read_run", 64 << 10),
    ("bench io --direct 0", bench, ["io", "--direct", "0"], "direct", False),
    ("bench io --direct 1", bench, ["io", "--no-direct", "--direct", "1"], "direct", True),
    ("admin --address", lambda a: admin_parser().parse_args(a), ["--address", "h:7420", "ls"], "tcp_address", "h:7420"),
    ("admin --address after the command", lambda a: admin_parser().parse_args(a), ["ls", "--address", "h:1"], "tcp_address", "h:1"),
    ("serve --tls-client-ca-file", serve, ["--tls-client-ca-file", "ca.pem"], "cfg_tls_ca_file", "ca.pem"),
    ("serve --auth-tokens-file", serve, ["--auth-tokens-file", "t.toml"], "cfg_auth_token_file", "t.toml"),
    ("serve --enable-admin true", serve, ["--enable-admin", "true"], "cfg_enable_admin", True),
    ("serve --enable-admin no", serve, ["--enable-admin", "no"], "cfg_enable_admin", False),
    ("serve --direct-io 0", serve, ["--direct-io", "0"], "cfg_direct_io", False),
    ("demo --direct-io false", lambda a: demo_parser().parse_args(a), ["--direct-io", "false"], "cfg_direct_io", False),
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
    (bench, ["restore", "--data-dir", "/d"], "directory", "/d"),
    (bench, ["io", "--chunked", "--max-read-run-bytes", "64k"], "max_read_run", 64 << 10),
    (bench, ["io", "--no-direct"], "direct", False),
    (bench, ["io", "--direct"], "direct", True),
    (lambda a: admin_parser().parse_args(a), ["--tcp-address", "h:7420", "ls"], "tcp_address", "h:7420"),
    (lambda a: admin_parser().parse_args(a), ["ls", "--tcp-address", "h:7420"], "tcp_address", "h:7420"),
    (lambda a: admin_parser().parse_args(a), ["--tls-ca-file", "ca.pem", "ls"], "tls_ca_file", "ca.pem"),
    (serve, ["--tls-ca-file", "ca.pem"], "cfg_tls_ca_file", "ca.pem"),
    (serve, ["--auth-token-file", "t"], "cfg_auth_token_file", "t"),
    (serve, ["--enable-admin"], "cfg_enable_admin", True),
    (serve, ["--no-enable-admin"], "cfg_enable_admin", False),
    (serve, ["--no-direct-io"], "cfg_direct_io", False),
    (serve, [], "cfg_enable_admin", None),  # unset: the file, the environment or the default decides
    (lambda a: demo_parser().parse_args(a), ["--no-direct-io"], "cfg_direct_io", False),
]


@pytest.mark.parametrize("parse, argv, attr, want", [a[1:] for a in ALIASES], ids=[a[0] for a in ALIASES])
def test_old_spelling_is_a_working_alias(parse, argv, attr, want):
    if "accuracy" in argv:
        from kvstore_tools.tasks import TASKS

        argv = [a if a != "kv-recall" else next(iter(TASKS)) for a in argv]
    assert getattr(parse(argv), attr) == want


@pytest.mark.parametrize("parse, argv, attr, want", NAMES)
def test_one_name_per_thing(parse, argv, attr, want):
    assert getattr(parse(argv), attr) == want


def subcommand_help(argv: list[str], name: str) -> str:
    return bench_parser(argv)._subparsers._group_actions[0].choices[name].format_help()


def serve_help() -> str:
    return kvstore_parser()._subparsers._group_actions[0].choices["serve"].format_help()


def test_aliases_are_hidden_from_help():
    text = admin_parser().format_help() + subcommand_help(["io"], "io") + subcommand_help(["restore"], "restore")
    for old in ("--socket ", "--token-file", "--directory", "--budget ", "--io-queue-depth", "--max-read-run ", "--address"):
        assert old not in text.replace("--tcp-address", ""), old
    text += serve_help()
    for old in ("--tls-client-ca-file", "--auth-tokens-file"):
        assert old not in text, old
    for name in ("--socket-path", "--auth-token-file", "--data-dir", "--budgets", "--tcp-address", "--tls-ca-file", "--max-read-run-bytes"):
        assert name in text, name


def test_booleans_show_as_flag_and_no_flag():
    text = serve_help() + subcommand_help(["io"], "io")
    for flag in (
        "--enable-admin, --no-enable-admin",
        "--direct-io, --no-direct-io",
        "--direct, --no-direct",
        "--read-only, --no-read-only",
    ):
        assert flag in text, flag


def test_serve_help_defaults_are_readable():
    text = " ".join(serve_help().split())  # unwrapped
    assert "(default: )" not in text
    assert "(default: 256 MiB)" in text and "(default: 8 MiB)" in text and "(default: 64 KiB)" in text and "(default: 1 TiB)" in text
    assert "(default: 268435456)" not in text and "(default: true)" in text
    assert "KVSTORE_IO_QUEUE_DEPTH" in text  # the environment variables are told once


@pytest.mark.parametrize(
    "argv",
    [["io", "--no-progress"], ["io", "--chunked", "--no-progress"], ["restore", "--no-progress"], ["--no-progress", "io"]],
    ids=["io", "io-chunked", "restore", "global"],
)
def test_no_progress_before_or_after_the_subcommand(argv):
    assert bench(argv).progress is False
    assert bench([a for a in argv if a != "--no-progress"]).progress is True


def test_every_bench_subcommand_takes_no_progress_and_log_level():
    names = list(bench_parser(["io"])._subparsers._group_actions[0].choices)
    assert len(names) > 10
    for name in names:
        text = subcommand_help([name], name)
        assert "--no-progress" in text and "--log-level" in text, name


@pytest.mark.parametrize(
    "parse, argv, want",
    [
        (lambda a: admin_parser().parse_args(a), ["--log-level", "debug", "ls"], "debug"),
        (lambda a: admin_parser().parse_args(a), ["ls", "--log-level", "error"], "error"),
        (lambda a: admin_parser().parse_args(a), ["ls"], "warning"),
        (bench, ["--log-level", "info", "io"], "info"),
        (bench, ["io", "--log-level", "debug"], "debug"),
        (bench, ["io"], "warning"),
        (lambda a: demo_parser().parse_args(a), ["--log-level", "warning"], "warning"),
        (lambda a: kvstore_parser().parse_args(a), ["health", "--log-level", "debug"], "debug"),
    ],
)
def test_log_level_everywhere(parse, argv, want):
    assert parse(argv).log_level == want


def test_serve_log_level_is_a_config_key():
    assert serve(["--log-level", "debug"]).cfg_log_level == "debug"
    proc = run_cli("kvstore.cli", "serve", "--log-level", "loud")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--log-level" in proc.stderr


def test_health_defaults_to_the_socket_serve_listens_on():
    clean = {k: v for k, v in os.environ.items() if k not in ("KVSTORE_SOCKET", "KVSTORE_SOCKET_PATH")}
    assert default_socket(clean) == ServerConfig().socket_path == ".kvstore/run/kvstore.sock"
    assert default_socket({**clean, "KVSTORE_SOCKET_PATH": "/a.sock", "KVSTORE_SOCKET": "/b.sock"}) == "/a.sock"
    assert default_socket({**clean, "KVSTORE_SOCKET": "/b.sock"}) == "/b.sock"


@pytest.mark.parametrize(
    "module, argv, flag",
    [
        ("kvstore.cli", ["serve", "--tcp-address", "127.0.0.1:99999"], "--tcp-address"),
        ("kvstore.cli", ["serve", "--tcp-address", "localhost"], "--tcp-address"),
        ("kvstore.cli", ["serve", "--metrics-address", "127.0.0.1:65536"], "--metrics-address"),
        ("kvstore_tools.admin", ["--tcp-address", "127.0.0.1:99999", "ls"], "--tcp-address"),
        ("kvstore_tools.admin", ["ls", "--address", "127.0.0.1:-1"], "--address"),
    ],
)
def test_an_address_out_of_range_is_refused_naming_the_flag(module, argv, flag):
    proc = run_cli(module, *argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"argument {flag}" in proc.stderr.strip().splitlines()[-1] and "0-65535" in proc.stderr


@pytest.mark.parametrize(
    "argv, flag",
    [(["--enable-admin", "maybe"], "--enable-admin"), (["--no-enable-admin", "true"], "--no-enable-admin")],
)
def test_a_bad_boolean_is_one_line_naming_the_flag(argv, flag):
    proc = run_cli("kvstore.cli", "serve", *argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and flag in proc.stderr


def test_defaults_unchanged_without_aliases():
    a = bench(["io"])
    assert a.directory == ".kvstore/bench" and a.iodepth == 16 and a.budget is None
    assert demo_parser().parse_args([]).budgets == [0.05, 0.25, 1.0]
    assert demo_parser().parse_args([]).target is None


@pytest.mark.parametrize(
    "module, argv",
    [
        ("kvstore.cli", []),
        ("kvstore.cli", ["serve"]),
        ("kvstore_tools.demo", []),
        ("kvstore_tools.admin", []),
        ("kvstore_tools.bench.cli", []),
    ],
    ids=["kvstore", "serve", "demo", "admin", "bench"],
)
def test_version_everywhere(module, argv):
    proc = subprocess.run([sys.executable, "-m", module, *argv, "--version"], cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert __version__ in proc.stdout


def test_bench_help_imports_no_torch():
    code = (
        "import sys\n"
        "from kvstore_tools.bench.cli import build_parser\n"
        "p = build_parser(['--help']); p.format_help(); build_parser(['io', '--help'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert {'io', 'reprefill', 'accuracy'} <= set(p._subparsers._group_actions[0].choices)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=data_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_daemon_and_admin_import_no_torch():
    code = "import sys, kvstore.server.app, kvstore.server.main, kvstore_tools.admin, engine_client.client\nassert 'torch' not in sys.modules\n"
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
    [
        ("kvstore_tools.admin", ["--timeout", "V", "ls"]),
        ("kvstore_tools.admin", ["ls", "--timeout", "V"]),
        ("kvstore.cli", ["health", "--timeout", "V"]),
    ],
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
