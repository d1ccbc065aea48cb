"""The reprefill bench's daemon arena holds a full load's Period (the daemon refuses a Period larger than its
stream reserve), and a call the daemon refuses ends the bench with one line, not a traceback."""

import dataclasses
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from engine_client.reprefill import model_geometry  # noqa: E402
from kvstore_tools.bench.layer_shapes import DEPTHS, shape_config  # noqa: E402
from kvstore_tools.bench.reprefill import _arena_bytes  # noqa: E402


def _model(shape: str, dtype):
    config = dataclasses.replace(shape_config(shape), num_hidden_layers=DEPTHS[shape])
    return SimpleNamespace(config=config, dtype=dtype)


def _args(tokens, period=8, group=4, system=""):
    return SimpleNamespace(prefix_tokens=tokens, period_layers=period, group_layers=group, store_probe_bits=0, system=system)


def _full_period_bytes(model, args) -> int:
    """What the daemon's admission asks for a full load of one Period: every chunk's extent of each group."""
    g = model_geometry(model, group_layers=args.group_layers)
    groups = range(args.period_layers // args.group_layers)
    return sum(g.extent_padded_bytes(k) for k in groups) * g.num_chunks(args.prefix_tokens)


@pytest.mark.parametrize("tokens", [4096, 16384])
def test_a_llama3_8b_full_load_period_fits_twice(tokens):
    model, args = _model("llama3-8b", torch.bfloat16), _args(tokens)
    period = _full_period_bytes(model, args)
    assert period == 8 * tokens * 2 * 8 * 128 * 2  # 8 layers of K and V, 8 heads of 128, bf16: 512 MiB at 16k
    assert _arena_bytes(model, args) >= 2 * period > 64 << 20


def test_a_small_prefix_keeps_the_64_mib_arena():
    assert _arena_bytes(_model("qwen2.5-0.5b", torch.bfloat16), _args(2048)) == 64 << 20


def test_a_named_systems_longer_periods_are_counted():
    model = _model("smollm2-135m", torch.float32)
    plain = _arena_bytes(model, _args(16384, period=2, group=1))
    assert _arena_bytes(model, _args(16384, period=2, group=1, system="full")) > plain  # "full" runs 8-layer Periods


def test_a_refused_call_ends_the_bench_in_one_line(monkeypatch, capsys):
    import grpc

    from engine_client.rpc import KVStoreRpcError
    from kvstore_tools.bench import cli

    def refused(args):
        raise KVStoreRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "period.chunks: needs 100 bytes")

    from kvstore import progress

    monkeypatch.setattr(progress, "_enabled", progress._enabled)  # main() sets it for the process: put back after
    parser = cli.build_parser(["io"])
    monkeypatch.setattr(cli, "build_parser", lambda argv: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: SimpleNamespace(progress=False, log_level="warning", run=refused))
    assert cli.main(["io"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "kvstore-bench: error: the daemon refused a call: RESOURCE_EXHAUSTED: period.chunks: needs 100 bytes"
