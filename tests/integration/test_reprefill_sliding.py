"""Re-Prefill of a model with sliding-window layers (a tiny random Gemma 3) through a real daemon.

Layers 0 and 2 slide (window 40 positions, not a multiple of the 16-token
chunk), layer 1 is global; the prefix (150 tokens, 10 chunks, the last one
short) is longer than the window.  A sliding layer loads exactly the last
chunks its window still sees at every budget; at a budget of every chunk the
Re-Prefill is the dense forward, and greedy decoding over the loaded rows is
dense greedy decoding while the window moves on.
"""

import json

import pytest
import torch
from helpers import run_bench
from safetensors.torch import save_file

from engine_client.client import KVStoreClient
from engine_client.generation import dense_generate
from engine_client.model.config import ModelConfig
from engine_client.model.loader import expected_tensors, load_checkpoint
from engine_client.reprefill import Budget, ModelRunner, ReprefillConfig
from engine_client.selection import window_chunk_count
from kvstore.contract.errors import InvalidArgument

WINDOW, N, S, CT = 40, 150, 7, 16
M = -(-N // CT)  # 10 chunks
GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "query_pre_attn_scalar": 12,
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "tie_word_embeddings": True,
}
# the selection without stand-ins (none are calibrated for this model): every layer its own set
CFG = ReprefillConfig().replace(standin_layers=(), report_attention=True)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3") / "hf"
    root.mkdir()
    gen = torch.Generator().manual_seed(0)
    shapes = expected_tensors(ModelConfig.from_dict(GEMMA3))
    save_file(
        {k: torch.randn(v, generator=gen) * (0.3 if "norm" in k else 0.2) for k, v in shapes.items()}, str(root / "model.safetensors")
    )
    (root / "config.json").write_text(json.dumps(GEMMA3))
    return root


@pytest.fixture(scope="module")
def gemma(gemma_dir):
    return load_checkpoint(str(gemma_dir), dtype=torch.float32)


@pytest.fixture
def stored(daemon, gemma):
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 96, (N,), generator=gen)
    suffix = torch.randint(0, 96, (S,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(gemma, client, probe_bits=4)
        yield runner, runner.store_prefix(prefix), prefix, suffix


def _window():
    return list(range(M - window_chunk_count(N, WINDOW, CT), M))


def test_window_chunks_are_those_holding_a_visible_position():
    assert _window() == [6, 7, 8, 9]  # the first query (150) sees 111..: chunk 6 holds 96..111
    assert window_chunk_count(152, WINDOW, CT) == 3  # the first query (152) sees 113..: chunk 6 (96..111) is out
    assert window_chunk_count(30, WINDOW, CT) == 2  # a prefix inside the window: every chunk


def test_full_budget_is_the_dense_forward_and_greedy_decoding(stored):
    runner, handle, prefix, suffix = stored
    full = CFG.replace(budget=1.0)
    res = runner.reprefill(handle.prefix_id, suffix, full)
    dense = runner.model.forward_full(torch.cat([prefix, suffix]))[-1]
    torch.testing.assert_close(res.logits, dense, rtol=1e-4, atol=1e-4)
    assert [c.tolist() for c in res.selected] == [_window(), list(range(M)), _window()]
    assert res.chunk_attention[0].numel() == 0 and res.chunk_attention[1].numel() == M  # sliding layers not measured
    gen = runner.generate(handle.prefix_id, suffix, full, max_new_tokens=12, eos_token_ids=[])
    ref = dense_generate(runner.model, prefix, suffix, max_new_tokens=12, eos_token_ids=[])
    assert gen.tokens == ref.tokens and len(gen.tokens) == 12
    assert gen.rows_attended == [N - 6 * CT, N, N - 6 * CT]


@pytest.mark.parametrize("budget", [0.1, 0.3, Budget.chunks(3), 1.0])
def test_a_sliding_layer_loads_its_window_at_any_budget_and_reads_what_the_geometry_says(stored, budget):
    runner, handle, prefix, suffix = stored
    res = runner.reprefill(handle.prefix_id, suffix, CFG.replace(budget=budget))
    plan = runner.plan(M, CFG, CFG.replace(budget=budget).budget, num_tokens=N)
    assert res.selected[0].tolist() == res.selected[2].tolist() == _window() and plan.windowed == (0, 2)
    assert len(res.selected[1]) == plan.periods[1][2] and 0 in res.selected[1].tolist()  # the global layer: its selection
    row_bytes = 2 * 2 * 16 * 4  # K and V, 2 KV heads, head dim 16, float32: one token of one layer
    tokens = sum(min(CT, N - c * CT) for chunks in res.selected for c in chunks.tolist())
    assert res.tokens_loaded == tokens and res.bytes_useful == tokens * row_bytes
    assert res.reported_units > 0  # the global layer's report


def test_sparse_rows_compute_as_in_process(stored):
    runner, handle, prefix, suffix = stored
    res = runner.reprefill(handle.prefix_id, suffix, CFG.replace(budget=0.3))
    kv = runner.model.prefill(prefix)[1]
    hidden, positions = runner.model.embed(suffix), torch.arange(N, N + S)
    for layer, chunks in enumerate(res.selected):
        at = torch.cat([torch.arange(c * CT, min(c * CT + CT, N)) for c in chunks.tolist()])
        hidden, _ = runner.model.layer_forward(layer, hidden, positions, kv[layer][:, :, at], prefix_positions=at)
    torch.testing.assert_close(res.logits, runner.model.final_logits(hidden), rtol=1e-4, atol=1e-4)
    gen = runner.generate(handle.prefix_id, suffix, CFG.replace(budget=0.3), max_new_tokens=6, eos_token_ids=[])
    keep = torch.cat([torch.arange(c * CT, min(c * CT + CT, N)) for c in res.selected[1].tolist()])
    assert gen.tokens[0] == int(res.logits.argmax()) and len(gen.tokens) == 6
    # decoding keeps each layer's loaded rows: the window's at the sliding layers, the selection at the global one
    assert gen.rows_attended == [N - 6 * CT, keep.numel(), N - 6 * CT]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(period_layers=2), "mix sliding-window and global layers"),
        (dict(whole_layers=(0,)), "slide"),
        (dict(standin_layers=(2,), selector="exact", probe_bits=4), "slide"),
    ],
)
def test_requests_the_window_cannot_serve_are_refused_in_one_line(stored, change, match):
    runner, handle, _, suffix = stored
    with pytest.raises(InvalidArgument, match=match):
        runner.reprefill(handle.prefix_id, suffix, CFG.replace(**change))


def test_reselecting_while_decoding_is_refused(stored):
    runner, handle, _, suffix = stored
    with pytest.raises(InvalidArgument, match="sliding-window"):
        runner.generate(handle.prefix_id, suffix, CFG.replace(reselect_every=1), max_new_tokens=2)


def _zipf(gemma_dir, directory, *systems_and_flags, expect=0):
    return run_bench(
        "reprefill", "--workload", "zipf", "--model", "tiny", "--checkpoint", str(gemma_dir), "--dtype", "float32",
        "--prefix-tokens", "400", "--suffix-tokens", str(S), "--prefixes", "2", "--requests", "2", "--warmup", "1",
        "--budgets", "0.1", "--group-layers", "1", "--memory-fraction", "1", "--threads", "1",
        "--directory", str(directory), *systems_and_flags, expect=expect,
    )  # fmt: skip


def test_the_zipf_bench_runs_the_product_and_a_full_load_over_sliding_layers(gemma_dir, tmp_path):
    """A sliding layer's Period loads its window (3 or 4 chunks), over the budget's 40 tokens by design:
    the bench's budget check holds the global layer to the budget and lets the windows through."""
    out = _zipf(gemma_dir, tmp_path, "--systems", "contiguouskv-perlayer,as-lru", "--period-layers", "1", "--json")
    report = json.loads(out.stdout)
    assert set(report["systems"]) == {"contiguouskv-perlayer@0.1", "as-lru@1", "recompute"}
    rows = report["requests"]["contiguouskv-perlayer@0.1"]
    assert rows and all(r["tokens_loaded"] > 40 for r in rows)  # the windows' rows are in the mean


def test_the_zipf_bench_refuses_what_cannot_run_on_sliding_layers_before_any_prefill(gemma_dir, tmp_path):
    err = _zipf(gemma_dir, tmp_path, "--systems", "impress", "--period-layers", "1", expect=1).stderr.strip()
    assert len(err.splitlines()) == 1 and "impress" in err and "sliding-window" in err and "prefilled" not in err
    err = _zipf(gemma_dir, tmp_path, "--systems", "contiguouskv", "--period-layers", "3", expect=1).stderr.strip()
    assert err.endswith("use period_layers=1") and "contiguouskv on tiny: period_layers" in err


def test_the_reprefill_bench_refuses_mixed_periods_first_and_ranks_only_the_selected_periods(gemma_dir, tmp_path):
    common = ["reprefill", "--model", "tiny", "--checkpoint", str(gemma_dir), "--dtype", "float32", "--prefix-tokens", "400"]
    common += ["--suffix-tokens", str(S), "--repeats", "2", "--threads", "1", "--directory", str(tmp_path), "--group-layers", "1"]
    err = run_bench(*common, "--period-layers", "3", expect=1).stderr.strip()
    assert err.endswith("use period_layers=1") and len(err.splitlines()) == 1  # no prefill before the refusal
    report = json.loads(run_bench(*common, "--period-layers", "1", "--budgets", "0.25", "--json").stdout)
    recall = report["systems"]["reprefill@0.25"]["recall"]  # the global layer's selection against its true top chunks
    assert recall is not None and 0 <= recall <= 1


def test_the_decode_bench_names_the_systems_sliding_layers_cannot_run(gemma):
    from types import SimpleNamespace

    from kvstore_tools.bench.decode import _refuse_on_sliding_windows, parse_systems
    from kvstore_tools.bench.io_jobs import BenchError

    def refuse(systems):
        _refuse_on_sliding_windows(SimpleNamespace(system_list=parse_systems(systems, "kv4"), model="tiny"), gemma)

    refuse("dense,ckv+int4-probes,ckv+int4-probes-kv4")  # they select once, at the Re-Prefill
    for name, what in (("quest", "re-selecting while decoding"), ("lserve-kv4", "streaming heads"), ("loopserve", "re-selecting")):
        with pytest.raises(BenchError, match=f"--systems {name}: {what}.* not supported on a model with sliding-window layers"):
            refuse(f"dense,{name}")
