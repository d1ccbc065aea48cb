"""A daemon-only install (``pip install .``: no torch, no matplotlib), simulated by a
``sitecustomize`` that makes those imports fail: what needs the engine extra says so in one line."""

import subprocess
import sys
import textwrap

import pytest
from helpers import data_root

BLOCKER = textwrap.dedent(
    """
    import sys

    BLOCKED = {"torch", "matplotlib", "safetensors", "gguf", "tokenizers"}

    class _NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
    """
)


@pytest.fixture
def without_engine(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)

    def run(module, *argv, timeout=120):
        env = {"PYTHONPATH": f"{site}:{data_root()}", "PATH": "/usr/bin:/bin"}
        cmd = [sys.executable, "-m", module, *argv]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)

    return run


def test_the_blocker_blocks(without_engine):
    proc = without_engine("kvstore.cli", "--version")  # the daemon's command line runs
    assert proc.returncode == 0, proc.stderr
    probe = without_engine("kvstore_tools.bench.plots")  # a module importing numpy only; then torch
    assert probe.returncode == 0, probe.stderr
    blocked = without_engine("torch")
    assert blocked.returncode == 1 and "No module named 'torch'" in blocked.stderr


@pytest.mark.parametrize("argv", [["reprefill", "--help"], ["restore", "--tokens", "64"], ["accuracy", "--help"]])
def test_a_subcommand_that_needs_torch_says_which_extra_in_one_line(without_engine, argv):
    proc = without_engine("kvstore_tools.bench.cli", *argv)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"kvstore-bench: error: kvstore-bench {argv[0]} needs ") and "pip install 'kvstore[engine]'" in line


def test_plot_without_matplotlib_is_refused_before_the_job_runs(without_engine, tmp_path):
    argv = [
        "io",
        "--data-dir",
        str(tmp_path / "d"),
        "--size",
        "1m",
        "--runtime",
        "30",
        "--backend",
        "posix",
        "--plot",
        str(tmp_path / "x.png"),
    ]
    proc = without_engine("kvstore_tools.bench.cli", *argv, timeout=20)  # the job would take 30 s
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "--plot needs matplotlib" in line and "pip install 'kvstore[engine]'" in line
    assert not (tmp_path / "d").exists()


def test_what_needs_no_extra_still_runs(without_engine):
    for module, argv in (
        ("kvstore_tools.bench.cli", ["io", "--help"]),
        ("kvstore_tools.admin", ["--help"]),
        ("kvstore.cli", ["serve", "--help"]),
    ):
        proc = without_engine(module, *argv)
        assert proc.returncode == 0, (module, proc.stderr)
