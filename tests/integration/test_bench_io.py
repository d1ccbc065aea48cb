"""Smoke runs of ``kvstore-bench io``: real CLI, real files, tiny and short.

Figures are not checked for speed (benchmarks are not tests), only that every
field is there, positive and consistent.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from helpers import assert_png

from kvstore.io import resolve_backend
from kvstore.io import uring as uring_module
from kvstore.io.kvikio_backend import unavailable_reason
from kvstore_tools.bench.cli import main
from kvstore_tools.bench.io_jobs import busy_core, format_bytes, iter_offsets, parse_size

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_JOB = ["--size", "8m", "--runtime", "1", "--bs", "64k", "--iodepth", "4", "--seed", "7"]
CLAT_KEYS = ("p50", "p90", "p99", "p99.9", "mean")


def run_io(capsys, tmp_path, *extra: str) -> tuple[int, str, str]:
    rc = main(["io", "--filename", str(tmp_path / "bench.io"), *SMALL_JOB, *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def check_row(row: dict, block_bytes: int) -> None:
    for key in ("io_bytes", "num_ios", "runtime_ms", "bw_bytes_per_s", "bw_mib_per_s", "bw_mb_per_s", "iops"):
        assert row[key] > 0, key
    for key in CLAT_KEYS:
        assert row["clat_us"][key] > 0, key
    assert row["cpu_us_per_io"] > 0 and row["cpu_user_s"] + row["cpu_sys_s"] > 0
    assert row["clat_us"]["p50"] <= row["clat_us"]["p99"] <= row["clat_us"]["p99.9"]
    assert row["bw_mb_per_s"] == pytest.approx(row["bw_bytes_per_s"] / 1e6)
    if block_bytes:
        assert row["io_bytes"] == row["num_ios"] * block_bytes


@pytest.mark.parametrize("rw", ["read", "randread", "write"])
def test_job_reports_every_field(capsys, tmp_path, rw):
    rc, out, _ = run_io(capsys, tmp_path, "--rw", rw, "--json")
    assert rc == 0
    report = json.loads(out)
    check_row(report["ours"], 64 << 10)
    assert report["ours"]["runtime_ms"] >= 900  # time based: ran for --runtime
    params = report["params"]
    assert (params["rw"], params["block_bytes"], params["iodepth"], params["size_bytes"]) == (rw, 64 << 10, 4, 8 << 20)
    assert params["layout"] == "created" and params["direct_effective"] and not params["page_cache"]
    st = os.stat(tmp_path / "bench.io")
    assert st.st_size == 8 << 20 and st.st_blocks * 512 >= 8 << 20  # real data, no holes
    assert report["machine"]["num_cpus"] >= 1


def test_file_is_reused_and_text_output_looks_like_fio(capsys, tmp_path):
    assert run_io(capsys, tmp_path, "--json")[0] == 0
    rc, out, _ = run_io(capsys, tmp_path)
    assert rc == 0
    assert "(8192KiB, reused)" in out
    assert f"kvstore({resolve_backend('auto')[0]}): rw=randread, bs=64.0KiB, iodepth=4, numjobs=1" in out
    assert "  read: IOPS=" in out and "MiB/s (" in out and "msec)" in out
    assert "    clat (usec): p50=" in out and "p99.9=" in out
    assert "  cpu: " in out and " us per I/O (user " in out
    assert "load average (1, 5, 15 min): " in out


@pytest.mark.parametrize(
    "backend",
    ["posix", pytest.param("uring", marks=pytest.mark.skipif(uring_module.unavailable_reason() is not None, reason="no io_uring"))],
)
def test_each_host_backend_runs_the_job(capsys, tmp_path, backend):
    rc, out, _ = run_io(capsys, tmp_path, "--backend", backend, "--json")
    assert rc == 0
    report = json.loads(out)
    assert report["ours"]["engine"] == f"kvstore({backend})" and report["params"]["backend"] == backend
    check_row(report["ours"], 64 << 10)
    assert len(report["machine"]["loadavg_before"]) == 3 and not report["params"]["busy_core"]


def test_busy_core_spins_a_competing_process_while_the_job_runs():
    with busy_core() as proc:
        ticks = _cpu_ticks(proc.pid)
        deadline = time.monotonic() + 10
        while _cpu_ticks(proc.pid) - ticks < 20 and time.monotonic() < deadline:  # 0.2 s of CPU
            time.sleep(0.05)
        assert proc.poll() is None and _cpu_ticks(proc.pid) - ticks >= 20
    assert proc.returncode is not None  # gone once the block ends
    with busy_core(False) as nothing:
        assert nothing is None


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_busy_core_is_reported(capsys, tmp_path):
    rc, out, _ = run_io(capsys, tmp_path, "--busy-core", "--runtime", "0.5")
    assert rc == 0 and ", one core busy" in out


def test_numjobs_two_aggregates_like_group_reporting(capsys, tmp_path):
    rc, out, _ = run_io(capsys, tmp_path, "--numjobs", "2", "--json")
    assert rc == 0
    ours = json.loads(out)["ours"]
    check_row(ours, 64 << 10)
    jobs = ours["per_job"]
    assert len(jobs) == 2 and all(job["num_ios"] > 0 for job in jobs)
    assert ours["io_bytes"] == sum(job["io_bytes"] for job in jobs)
    assert ours["num_ios"] == sum(job["num_ios"] for job in jobs)
    assert ours["runtime_ms"] == max(job["runtime_ms"] for job in jobs)


def test_module_runs_as_a_program(tmp_path):
    cmd = [sys.executable, "-m", "kvstore_tools.bench.cli", "io", "--filename", str(tmp_path / "b.io"), *SMALL_JOB, "--json"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    check_row(json.loads(proc.stdout)["ours"], 64 << 10)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--bs", "6000"], "--bs"),  # not 4 KiB aligned with --direct 1
        (["--bs", "12q"], "--bs"),
        (["--rw", "randwrite"], "--rw"),
        (["--size", "1000"], "--size"),
        (["--direct", "2"], "--direct"),
    ],
)
def test_bad_arguments_exit_nonzero_naming_the_option(capsys, tmp_path, args, option):
    rc, out, err = run_io(capsys, tmp_path, *args)
    assert rc == 2
    assert option in err and out == ""
    assert not (tmp_path / "bench.io").exists()


def test_unaligned_block_is_fine_without_direct(capsys, tmp_path):
    rc, out, _ = run_io(capsys, tmp_path, "--bs", "6000", "--direct", "0", "--runtime", "0.2", "--json")
    assert rc == 0
    report = json.loads(out)
    assert report["params"]["page_cache"] and report["ours"]["io_bytes"] % 6000 == 0


@pytest.mark.skipif(unavailable_reason() is None, reason="kvikio can run here")
def test_unavailable_backend_is_a_clean_error(capsys, tmp_path):
    rc, _, err = run_io(capsys, tmp_path, "--backend", "kvikio")
    assert rc == 1 and "kvikio" in err and "Traceback" not in err


def test_compare_fio_without_fio_says_how_to_install(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no fio there
    rc, _, err = run_io(capsys, tmp_path, "--compare-fio")
    assert rc == 1 and "apt-get install -y fio" in err


def test_compare_fio(capsys, tmp_path):
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (apt-get install -y fio)")
    rc, out, _ = run_io(capsys, tmp_path, "--compare-fio", "--json", "--plot", str(tmp_path / "io.png"))
    assert rc == 0
    assert_png(tmp_path / "io.png")
    report = json.loads(out)
    assert set(report) == {"ours", "fio", "ratio", "params", "machine"}
    check_row(report["ours"], 64 << 10)
    check_row(report["fio"], 64 << 10)
    assert report["fio"]["engine"] == "fio(libaio)" and report["machine"]["fio_version"].startswith("fio")
    for name in ("bw", "iops", "clat_p50", "clat_p99", "cpu_per_io"):
        assert report["ratio"][name] > 0
    assert report["ratio"]["bw"] == pytest.approx(report["ours"]["bw_bytes_per_s"] / report["fio"]["bw_bytes_per_s"])


def test_sizes_parse_and_print_like_fio():
    assert [parse_size(s) for s in ("4k", "32K", "256KiB", "1m", "1MB", "2g", "4096")] == [
        4096,
        32768,
        262144,
        1 << 20,
        1 << 20,
        2 << 30,
        4096,
    ]
    with pytest.raises(ValueError):
        parse_size("12q")
    assert [format_bytes(n) for n in (262144, 2466 << 20, 19 << 30)] == ["256KiB", "2466MiB", "19.0GiB"]
    assert format_bytes(2045e6, base=1000) == "2045MB"


def test_random_offsets_visit_every_block_once_per_pass():
    offsets = iter_offsets("randread", 4096, 64 * 4096, seed=3)
    first, second = [next(offsets) for _ in range(64)], [next(offsets) for _ in range(64)]
    assert sorted(first) == sorted(second) == list(range(0, 64 * 4096, 4096))
    assert first != second
    sequential = iter_offsets("read", 4096, 3 * 4096 + 100, seed=0)
    assert [next(sequential) for _ in range(4)] == [0, 4096, 8192, 0]


def test_chunked_max_read_run_reaches_the_store(capsys, tmp_path):
    """``--max-read-run`` bounds coalescing: at one padded extent (4 KiB here) no runs merge."""
    tiny = ["io", "--chunked", "--data-dir", str(tmp_path), "--layers", "4", "--kv-heads", "1", "--head-dim", "8", "--tokens", "512"]
    tiny += ["--runtime", "0.2", "--budgets", "0.25", "--selection", "runs", "--seed", "3", "--json"]
    reports = []
    for extra in ([], ["--max-read-run", "4k"]):
        assert main([*tiny, *extra]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    default, one_extent = reports
    assert default["store"]["max_read_run_bytes"] == 8 << 20 and one_extent["store"]["max_read_run_bytes"] == 4096
    on, off = default["cases"]
    assert on["io_requests_per_read"] < off["io_requests_per_read"]
    on, off = one_extent["cases"]
    assert on["io_requests_per_read"] == off["io_requests_per_read"]
