"""Trace files a replay refuses, the --profile flag's errors, and the selection model's ordering."""

import json

import pytest

from kvstore_tools.bench.io_jobs import BenchError
from kvstore_tools.bench.replay import Clock, profile_arg, selection_cost
from kvstore_tools.bench.trace import KIND, VERSION
from kvstore_tools.bench.trace import load_trace as _load
from kvstore_tools.bench.workload import SYSTEMS

HEADER = {
    "kind": KIND,
    "version": VERSION,
    "model": {},
    "prefixes": [{"index": 0, "num_tokens": 32, "tokens": list(range(32))}],
    "systems": [{"key": "contiguouskv@0.25", "name": "contiguouskv"}],
    "run": {},
}
REQUEST = {"system": "contiguouskv@0.25", "prefix": 0, "events": [{"op": "describe"}]}


def load_trace(path):
    return _load(path, SYSTEMS)


def _write(tmp_path, *objs):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return str(path)


def _error(path) -> str:
    with pytest.raises(BenchError) as info:
        load_trace(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("--trace: ")
    return msg


def test_a_good_trace_loads(tmp_path):
    header, requests = load_trace(_write(tmp_path, HEADER, REQUEST))
    assert header["systems"][0]["key"] == "contiguouskv@0.25" and len(requests) == 1


def test_missing_header(tmp_path):
    assert "no trace header" in _error(_write(tmp_path, REQUEST))


def test_wrong_version(tmp_path):
    assert "version 99" in _error(_write(tmp_path, {**HEADER, "version": 99}, REQUEST))


def test_unknown_system(tmp_path):
    systems = [{"key": "vllm@0.25", "name": "vllm"}]
    assert "unknown system 'vllm'" in _error(_write(tmp_path, {**HEADER, "systems": systems}, REQUEST))


@pytest.mark.parametrize(
    "request_, words",
    [
        ({**REQUEST, "system": "as-lru@1"}, "not in the header"),
        ({**REQUEST, "events": [{"op": "compute"}]}, "unknown event"),
        ({**REQUEST, "prefix": 3}, "names prefix 3"),
    ],
)
def test_bad_request_lines(tmp_path, request_, words):
    assert words in _error(_write(tmp_path, HEADER, request_))


def test_not_json_and_no_requests_and_no_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    assert "line 1 is not JSON" in _error(str(bad))
    assert "no requests" in _error(_write(tmp_path, HEADER))
    assert "cannot read" in _error(str(tmp_path / "absent.jsonl"))


@pytest.mark.parametrize(
    "text, flag",
    [
        ("h900", "--profile: unknown profile"),
        ("custom:flops=1e15,bw=2e12", "--profile.h2d: is required"),
        ("custom:flops=1e15,bw=2e12,h2d=-1", "--profile.h2d: must be a positive"),
        ("custom:flops=1e15,bw=2e12,h2d=5e10,eff=2", "--profile.eff: must be in (0, 1]"),
    ],
)
def test_profile_errors_name_the_flag(text, flag):
    with pytest.raises(BenchError) as info:
        profile_arg(text)
    assert str(info.value).startswith(flag) and "\n" not in str(info.value)


def test_profile_names_and_custom():
    assert profile_arg("H100").name == "h100"
    assert profile_arg("custom:flops=1e15,bw=2e12,h2d=5e10").h2d_bytes_per_s == 5e10


def test_selection_model_costs_what_each_system_scores():
    from engine_client.model.config import ModelConfig

    c = ModelConfig("Qwen2ForCausalLM", 151936, 896, 4864, 24, 14, 2, 64, 1e6, 1e-6, 32768, True, True)
    h100 = profile_arg("h100")

    def cost(selection, selector="summary", chunks=16, probe_bits=0, suffix=64):
        system = {"system": {"selection": selection}, "config": {"selector": selector, "probe_bits": probe_bits}}
        return selection_cost(system, c, h100, suffix, 32768, 2048, chunks)

    queries_only = cost("h2o")
    assert cost("full") == queries_only == cost("summary", chunks=2048)  # a full set is not scored
    assert queries_only < cost("summary") < cost("impress") < cost("summary", "exact")
    assert cost("perlayer-follow-int4", "exact", probe_bits=4) <= cost("summary", "exact")  # 64 queries: compute-bound
    assert cost("perlayer-follow-int4", "exact", probe_bits=4, suffix=1) < cost("summary", "exact", suffix=1)  # reading keys


def test_clock_takes_an_overshoot_off_the_next_wait():
    clock = Clock()
    clock.debt = 0.004
    clock.wait(0.003)  # within the debt: no wait, 1 ms still owed
    assert clock.debt == pytest.approx(0.001)


def _report(tokens: int, io_wait: float, compute: float, cpu_io: float, cpu_compute: float) -> dict:
    row = {
        "ttft_mean_s": io_wait + compute + 0.001,
        "ttft_p95_s": 2 * (io_wait + compute),
        "select_mean_s": 1e-4,
        "io_wait_mean_s": io_wait,
        "compute_mean_s": compute,
        "bytes_disk_mean": 1e6 * tokens / 1024,
        "bytes_received_mean": 2e6,
    }
    timed = {
        "warmup": False,
        "cpu_ttft_s": cpu_io + cpu_compute,
        "cpu_io_wait_s": cpu_io,
        "cpu_compute_s": cpu_compute,
        "cpu_select_s": 0.01,
    }
    warm = {**timed, "warmup": True, "cpu_ttft_s": 99.0}
    return {
        "profile": {"name": "h100"},
        "run": {"prefix_tokens": tokens},
        "systems": {"a@0.05": row, "only-here@0.05": row},
        "requests": {"a@0.05": [warm, timed, timed], "only-here@0.05": [timed]},
    }


def test_scaling_rows_take_each_length_and_say_which_wait_is_larger():
    from kvstore_tools.bench.replay_report import format_scaling, scaling_rows

    reports = [_report(2048, 0.002, 0.004, 0.001, 1.0), _report(8192, 0.020, 0.005, 0.5, 0.2)]
    reports[1]["systems"].pop("only-here@0.05")  # in one trace only: left out
    rows = scaling_rows(reports)
    assert set(rows) == {"a@0.05"} and set(rows["a@0.05"]) == {"2048", "8192"}
    short, long = rows["a@0.05"]["2048"], rows["a@0.05"]["8192"]
    assert (short["bound"], long["bound"]) == ("compute", "I/O")
    assert (short["cpu_bound"], long["cpu_bound"]) == ("compute", "I/O")
    assert short["cpu"]["ttft_s"] == pytest.approx(1.001)  # the warm-up request is not averaged in
    text = format_scaling({"traces": reports, "scaling": rows})
    assert "8192 tokens" in text and "a@0.05" in text
