"""A trace recorded by a small Zipf run, replayed twice against real daemons:
the replay's reads are the recorded run's, request by request."""

import json

import pytest
from helpers import assert_png, run_bench

SYSTEMS = "contiguouskv,contiguouskv-noprefetch,impress"  # no full-load system: the replay adds one


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``(trace path, the recording run's report, data directory)``: tiny model, 2 layers, Periods of 1 layer."""
    directory = tmp_path_factory.mktemp("replay")
    trace = directory / "trace.jsonl"
    proc = run_bench(
        "reprefill",
        "--workload",
        "zipf",
        "--systems",
        SYSTEMS,
        "--model",
        "tiny",
        "--dtype",
        "float32",
        "--prefix-tokens",
        "512",
        "--suffix-tokens",
        "8",
        "--prefixes",
        "2",
        "--requests",
        "3",
        "--warmup",
        "1",
        "--budgets",
        "0.25",
        "--period-layers",
        "1",
        "--group-layers",
        "1",
        "--memory-fraction",
        "0.5",
        "--threads",
        "1",
        "--directory",
        str(directory),
        "--trace-out",
        str(trace),
        "--json",
    )
    return trace, json.loads(proc.stdout), directory


@pytest.fixture(scope="module")
def replays(recorded):
    trace, _, directory = recorded
    return [
        json.loads(run_bench("replay", "--trace", str(trace), "--profile", "h100", "--directory", str(directory), "--json").stdout)
        for _ in range(2)
    ]


def _trace_lines(trace):
    return [json.loads(line) for line in trace.read_text().splitlines()]


def test_trace_holds_every_request_of_every_system_and_what_the_runner_received(recorded):
    trace, report, _ = recorded
    header, *lines = _trace_lines(trace)
    assert [s["key"] for s in header["systems"]] == [f"{n}@0.25" for n in SYSTEMS.split(",")]
    for key, rows in report["requests"].items():
        timed = [r for r in lines if r["system"] == key and not r["warmup"]]
        assert [r["request"] for r in timed] == [row["request"] for row in rows]
        for line, row in zip(timed, rows):
            received = sum(e["bytes"] for e in line["events"] if e["op"] == "group")
            assert received == row["bytes_useful"]  # the stream's own count of what it delivered
            assert len(line["periods"]) == 2 and all(p["reports"] for p in line["periods"])
            assert len(line["cpu"]["layer_compute_s"]) == 2


def test_replay_reads_what_the_recorded_run_read_twice_over(recorded, replays):
    trace, _, _ = recorded
    _, *lines = _trace_lines(trace)
    first, second = replays
    for key in (s + "@0.25" for s in SYSTEMS.split(",")):
        traced = [r for r in lines if r["system"] == key]
        # without speculation the disk reads are fixed by the sets and the tiers; a speculative
        # read's fate (used, cancelled) depends on timing, so only what was delivered is compared
        fixed = not key.startswith("contiguouskv@")
        for a, b, line in zip(first["requests"][key], second["requests"][key], traced, strict=True):
            sent = [[e["period"], e["chunks"]] for e in line["events"] if e["op"] == "send"]
            got = [[e["group"], e["rows"], e["bytes"]] for e in line["events"] if e["op"] == "group"]
            assert a["sets"] == b["sets"] == sent
            assert a["hints"] == b["hints"] == [[e["period"], e["chunks"]] for e in line["events"] if e["op"] == "hint"]
            assert bool(a["hints"]) == key.startswith("contiguouskv@")  # only the product sends look-ahead hints
            assert a["groups"] == b["groups"] == got
            assert a["state_bytes"] == b["state_bytes"] == sum(e["bytes"] for e in line["events"] if e["op"] == "summaries")
            if fixed:
                close = next(e for e in line["events"] if e["op"] == "close")
                assert a["bytes_disk"] == b["bytes_disk"] == close["stats"]["bytes_disk"] + a["state_bytes"]
        if fixed:
            assert first["systems"][key]["daemon_bytes_read"] == second["systems"][key]["daemon_bytes_read"] > 0


def test_replay_adds_a_full_load_row_and_its_ratios(replays):
    report = replays[0]
    full = report["requests"]["full-load@1"]
    assert all(r["bytes_received"] == 2 * 512 * 2 * 2 * 16 * 4 for r in full)  # 2 layers x 512 rows x K,V x 2 heads x 16 x fp32
    assert set(report["ratios"]) >= {"ttft full-load@1 / contiguouskv@0.25", "ttft impress@0.25 / contiguouskv@0.25"}
    for key, row in report["systems"].items():
        assert row["runs"] == 3
        parts = row["select_mean_s"] + row["io_wait_mean_s"] + row["compute_mean_s"] + row["fetch_mean_s"] + row["other_mean_s"]
        assert parts == pytest.approx(row["ttft_mean_s"])
        assert row["compute_mean_s"] > 0 and row["ttft_mean_s"] >= row["compute_mean_s"]


def test_replay_rejects_a_bad_profile_in_one_line(recorded):
    trace, _, directory = recorded
    proc = run_bench("replay", "--trace", str(trace), "--profile", "custom:flops=1e15,bw=x", expect=1)
    assert proc.stderr.strip().count("\n") == 0
    assert "--profile.bw" in proc.stderr and "not a number" in proc.stderr


def test_replay_at_several_concurrent_streams_replays_every_timed_request_per_stream(recorded, tmp_path):
    trace, _, directory = recorded
    args = ("replay", "--trace", str(trace), "--directory", str(directory), "--systems", "impress@0.25")
    proc = run_bench(*args, "--concurrency", "1,3", "--plot", str(tmp_path / "c.png"), "--json")
    assert_png(tmp_path / "c.png")
    report = json.loads(proc.stdout)
    levels = report["concurrency"]["impress@0.25"]
    timed = report["systems"]["impress@0.25"]["runs"]
    assert set(levels) == {"1", "3"}
    assert levels["1"]["requests"] == timed and levels["3"]["requests"] + levels["3"]["failed"] == 3 * timed
    assert levels["3"]["requests_per_s"] > 0 and levels["3"]["ttft_p95_s"] >= levels["3"]["ttft_mean_s"] * 0.5
    bad = run_bench(*args, "--concurrency", "0,2", expect=2)
    assert "--concurrency" in bad.stderr and "[1, 64]" in bad.stderr
    alone = run_bench(*args, "--plot", str(tmp_path / "d.png"), expect=1)
    assert "--plot" in alone.stderr and alone.stderr.strip().count("\n") == 0


def test_replay_of_several_traces_adds_the_scaling_table_and_its_plot(recorded, tmp_path):
    trace, _, directory = recorded
    both = f"{trace},{trace}"
    proc = run_bench(
        "replay", "--trace", both, "--directory", str(directory), "--systems", "impress@0.25", "--plot", str(tmp_path / "s.png"), "--json"
    )
    assert_png(tmp_path / "s.png")
    report = json.loads(proc.stdout)
    assert len(report["traces"]) == 2
    tokens = str(report["traces"][0]["run"]["prefix_tokens"])
    row = report["scaling"]["impress@0.25"][tokens]
    assert row["bound"] in ("I/O", "compute") and row["cpu"]["ttft_s"] > 0
    assert row["ttft_mean_s"] == report["traces"][1]["systems"]["impress@0.25"]["ttft_mean_s"]  # the last replay of that length


def _measured_profile(path, **rates):
    """A ``file:`` profile as ``kvstore-bench calibrate`` writes it (H200-like rates unless given)."""
    fields = dict(
        name="calibrated-test",
        peak_flops=539e12,
        mem_bytes_per_s=3.8e12,
        h2d_bytes_per_s=54.9e9,
        matmul_efficiency=1.0,
        mem_efficiency=1.0,
        layer_overhead_s=60e-6,
        dtype_bytes=2,
        pageable_h2d_bytes_per_s=8.8e9,
        disk_bytes_per_s=1.6e9,
        period_overhead_s=0.3e-3,
        source="test rates",
    )
    path.write_text(json.dumps(fields | rates))
    return f"file:{path}"


def test_recompute_is_a_row_and_the_choice_takes_the_time_of_the_path_it_picks(recorded, tmp_path):
    from engine_client.compute_model import parse_profile
    from engine_client.model.config import ModelConfig
    from engine_client.path_choice import RequestShape, recompute_seconds

    trace, _, directory = recorded
    header = _trace_lines(trace)[0]
    profile = _measured_profile(tmp_path / "p.json")
    report = json.loads(run_bench("replay", "--trace", str(trace), "--profile", profile, "--directory", str(directory), "--json").stdout)
    config, run = ModelConfig(**header["model"]["config"]), header["run"]
    want = recompute_seconds(config, parse_profile(profile), RequestShape(run["prefix_tokens"], run["suffix_tokens"], 0, 1, 1.0))
    assert report["systems"]["recompute"]["ttft_mean_s"] == pytest.approx(want)
    assert report["systems"]["recompute"]["bytes_disk_mean"] == 0
    rows = [r for r in report["requests"]["choice@0.25"] if not r["warmup"]]
    assert len(rows) == 3 and report["choice_note"] is None
    source = {"recompute": "recompute", "full-load": "full-load@1", "sparse": "contiguouskv@0.25"}
    for row in rows:
        assert row["chosen"] == min(row["predicted"], key=row["predicted"].get)
        taken = next(r for r in report["requests"][source[row["chosen"]]] if r["request"] == row["request"])
        assert row["ttft_s"] == taken["ttft_s"]  # the prediction picks, the replay times
    # a 2-layer model on a 512-token prefix: recomputing it is far cheaper than any read from a 1.6 GB/s disk
    assert {r["chosen"] for r in rows} == {"recompute"}
    slow_gpu = _measured_profile(tmp_path / "slow.json", peak_flops=1e9, mem_bytes_per_s=1e9, disk_bytes_per_s=1e12)
    report = json.loads(run_bench("replay", "--trace", str(trace), "--profile", slow_gpu, "--directory", str(directory), "--json").stdout)
    # a machine that computes slowly next to a fast disk loads instead
    assert {r["chosen"] for r in report["requests"]["choice@0.25"]} <= {"sparse", "full-load"}
    assert report["systems"]["recompute"]["ttft_mean_s"] > report["systems"]["choice@0.25"]["ttft_mean_s"]


def test_a_named_profile_has_no_choice_row_and_says_why(replays):
    report = replays[0]
    assert "recompute" in report["systems"] and not any(k.startswith("choice@") for k in report["systems"])
    assert "no disk rate" in report["choice_note"] and "kvstore-bench calibrate" in report["choice_note"]


def test_the_storage_paths_fixed_cost_is_its_own_column(replays):
    """fetch + other: what a request spends outside disk waits, selection and compute; zero for modelled recompute."""
    for key, row in replays[0]["systems"].items():
        assert row["storage_fixed_mean_s"] == pytest.approx(row["fetch_mean_s"] + row["other_mean_s"])
        if key == "recompute":
            assert row["storage_fixed_mean_s"] == 0
        else:
            assert row["storage_fixed_mean_s"] > 0  # a replayed request always pays its round trips
        # (res): over the timed requests that read no disk byte and fetched no state, recounted from the records
        timed = [r for r in replays[0]["requests"][key] if not r["warmup"]]
        resident = [r["fetch_s"] + r["other_s"] for r in timed if r["bytes_disk"] == 0 and r["state_bytes"] == 0]
        assert row["resident_requests"] == len(resident)
        if resident:
            assert row["storage_fixed_resident_mean_s"] == pytest.approx(sum(resident) / len(resident))
        else:
            assert row["storage_fixed_resident_mean_s"] is None
    replayed = [r for r in replays[0]["systems"].values() if r["kind"] == "replayed"]
    assert any(r["resident_requests"] for r in replayed)  # the trace has such requests


def test_where_a_periods_compute_cannot_hide_a_read_the_choice_takes_a_replay_without_speculation(recorded, tmp_path):
    trace, _, directory = recorded

    def replay(profile):
        return json.loads(run_bench("replay", "--trace", str(trace), "--profile", profile, "--directory", str(directory), "--json").stdout)

    # compute cheap beside a 10 ms round trip a Period, a prefill dearer than loading, a disk slow enough that
    # the full load's four times the bytes price it well above the sparse path (the choice reprices by what
    # it measures on this machine, so the margin is kept wide): sparse, without speculation
    report = replay(
        _measured_profile(tmp_path / "q.json", peak_flops=1e9, mem_bytes_per_s=1e9, disk_bytes_per_s=3e6, period_overhead_s=1e-2)
    )
    quiet, spec = report["requests"]["contiguouskv-nospec@0.25"], report["requests"]["contiguouskv@0.25"]
    assert sum(r["spec_used"] + r["spec_wasted"] for r in spec) > 0  # the traced run speculated
    assert all(r["spec_used"] + r["spec_wasted"] == 0 for r in quiet)
    assert [r["sets"] for r in quiet] == [r["sets"] for r in spec]  # the same requests, the same sets
    rows = [r for r in report["requests"]["choice@0.25"] if not r["warmup"]]
    assert rows and {r["chosen"] for r in rows} == {"sparse"}
    for row in rows:
        assert "no speculation" in row["reason"]
        assert row["ttft_s"] == next(r["ttft_s"] for r in quiet if r["request"] == row["request"])
    # slow compute: a Period outlasts its read, speculation stays and no second replay is made
    report = replay(
        _measured_profile(tmp_path / "s.json", peak_flops=1e8, mem_bytes_per_s=1e8, disk_bytes_per_s=1e12, period_overhead_s=1e-3)
    )
    assert not any("nospec" in key for key in report["systems"])
    choices = report["requests"]["choice@0.25"]
    # priced by the profile alone, the first request takes the sparse path; later ones are repriced by what
    # the replay measured, which depends on this machine's load, so only the speculation is checked there
    assert choices[0]["chosen"] == "sparse"
    assert all("no speculation" not in r["reason"] for r in choices)


def test_the_replayed_choice_reprices_a_path_by_what_it_replayed(recorded, tmp_path):
    """A profile that prices the sparse path below any round trip: the first request takes it, and what the
    replay timed it at is its price for the requests after, so they go to the path priced below that."""
    trace, _, directory = recorded
    underpriced = _measured_profile(
        tmp_path / "u.json", peak_flops=1e10, mem_bytes_per_s=1e12, disk_bytes_per_s=1e12, period_overhead_s=1e-6, layer_overhead_s=1e-6
    )
    report = json.loads(
        run_bench("replay", "--trace", str(trace), "--profile", underpriced, "--directory", str(directory), "--json").stdout
    )
    rows = report["requests"]["choice@0.25"]
    first, later = rows[0], rows[1:]
    assert first["chosen"] == "sparse" and first["predicted"] == first["modelled"] and "measured" not in first["reason"]
    assert later and all(r["chosen"] == min(r["predicted"], key=r["predicted"].get) for r in rows)
    second = later[0]
    assert second["predicted"]["sparse"] == pytest.approx(first["ttft_s"] * second["modelled"]["sparse"] / first["modelled"]["sparse"])
    assert second["chosen"] != "sparse" and "sparse: " in second["reason"]
