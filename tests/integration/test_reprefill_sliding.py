"""Re-Prefill of a model with sliding-window layers (a tiny random Gemma 3) through a real daemon.

Layers 0 and 2 slide (window 40 positions, not a multiple of the 16-token
chunk), layer 1 is global; the prefix (150 tokens, 10 chunks, the last one
short) is longer than the window.  Both layouts run every test: the window
tail (the default: extents hold layer 1 only, the sliding layers' last 48
rows are the prefix's tail pages) and every layer stored whole (a sliding
layer loads exactly the last chunks its window still sees).  At any budget a
sliding layer sees its window; at a budget of every chunk the Re-Prefill is
the dense forward, and greedy decoding over the loaded rows is dense greedy
decoding while the window moves on.
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
from engine_client.stream_tail import TailMissing
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


TAIL_ROWS = -(-WINDOW // CT) * CT  # 48: the window tail's rows, whole pages


@pytest.fixture(params=["tail", "whole"])
def stored(request, daemon, gemma):
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 96, (N,), generator=gen)
    suffix = torch.randint(0, 96, (S,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(gemma, client, probe_bits=4, window_tail=None if request.param == "tail" else False)
        yield runner, runner.store_prefix(prefix), prefix, suffix


def _window():
    return list(range(M - window_chunk_count(N, WINDOW, CT), M))


def _sliding_rows(runner) -> torch.Tensor:
    """The prefix positions a sliding layer computes on: the tail's last 48, or its window's chunks."""
    if runner.window is not None:
        return torch.arange(N - TAIL_ROWS, N)
    return torch.cat([torch.arange(c * CT, min(c * CT + CT, N)) for c in _window()])


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
    sliding = _sliding_rows(runner).numel()
    assert gen.rows_attended == [sliding, N, sliding] and sliding == (TAIL_ROWS if runner.window else N - 6 * CT)


@pytest.mark.parametrize("budget", [0.1, 0.3, Budget.chunks(3), 1.0])
def test_a_sliding_layer_loads_its_window_at_any_budget_and_reads_what_the_geometry_says(stored, budget):
    runner, handle, prefix, suffix = stored
    res = runner.reprefill(handle.prefix_id, suffix, CFG.replace(budget=budget))
    plan = runner.plan(M, CFG, CFG.replace(budget=budget).budget, num_tokens=N)
    assert res.selected[0].tolist() == res.selected[2].tolist() == _window() and plan.windowed == (0, 2)
    assert len(res.selected[1]) == plan.periods[1][2] and 0 in res.selected[1].tolist()  # the global layer: its selection
    row_bytes = 2 * 2 * 16 * 4  # K and V, 2 KV heads, head dim 16, float32: one token of one layer
    global_tokens = sum(min(CT, N - c * CT) for c in res.selected[1].tolist())
    sliding = _sliding_rows(runner).numel()
    assert res.tokens_loaded == 2 * sliding + global_tokens
    # from the daemon's extents: the global layer's chunks, and in the whole layout the windows' too
    assert res.bytes_useful == (global_tokens + (0 if runner.window else 2 * sliding)) * row_bytes
    assert res.reported_units > 0  # the global layer's report


def test_sparse_rows_compute_as_in_process(stored):
    runner, handle, prefix, suffix = stored
    res = runner.reprefill(handle.prefix_id, suffix, CFG.replace(budget=0.3))
    kv = runner.model.prefill(prefix)[1]
    hidden, positions = runner.model.embed(suffix), torch.arange(N, N + S)
    for layer, chunks in enumerate(res.selected):
        at = torch.cat([torch.arange(c * CT, min(c * CT + CT, N)) for c in chunks.tolist()]) if layer == 1 else _sliding_rows(runner)
        hidden, _ = runner.model.layer_forward(layer, hidden, positions, kv[layer][:, :, at], prefix_positions=at)
    torch.testing.assert_close(res.logits, runner.model.final_logits(hidden), rtol=1e-4, atol=1e-4)
    gen = runner.generate(handle.prefix_id, suffix, CFG.replace(budget=0.3), max_new_tokens=6, eos_token_ids=[])
    keep = torch.cat([torch.arange(c * CT, min(c * CT + CT, N)) for c in res.selected[1].tolist()])
    assert gen.tokens[0] == int(res.logits.argmax()) and len(gen.tokens) == 6
    # decoding keeps each layer's loaded rows: the window's at the sliding layers, the selection at the global one
    sliding = _sliding_rows(runner).numel()
    assert gen.rows_attended == [sliding, keep.numel(), sliding]


def test_the_window_tail_stores_the_global_layer_as_extents_and_each_prefix_its_own_tail(daemon, gemma):
    """The extents hold layer 1 only; a prefix of the stored one and a longer one sharing its chunks each
    get their own tail and answer as the dense forward; a prefix whose tail is gone is stored again."""
    gen = torch.Generator().manual_seed(7)
    long = torch.randint(0, 96, (N + 60,), generator=gen)
    suffix = torch.randint(0, 96, (S,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        tail, whole = ModelRunner(gemma, client), ModelRunner(gemma, client, window_tail=False)
        assert tail.layers.layers == (1,) and tail.window.pairs == ((0, 0), (0, 1), (2, 0), (2, 1))
        assert tail.geometry.model.num_layers == 1 and whole.geometry.model.num_layers == 3
        handles = {}
        for n in (N, 100, N + 60):  # the first stored, a prefix of it, a longer one sharing its chunks
            handles[n] = h = tail.store_prefix(long[:n])
            assert client.describe(h.prefix_id).geometry == tail.geometry
            res = tail.reprefill(h.prefix_id, suffix, CFG.replace(budget=1.0))
            dense = gemma.forward_full(torch.cat([long[:n], suffix]))[-1]
            torch.testing.assert_close(res.logits, dense, rtol=1e-4, atol=1e-4)
        w = whole.store_prefix(long[:N])
        assert w.prefix_id != handles[N].prefix_id  # another layout, another prefix id
        # the extents and tail of the window tail against every layer whole
        assert handles[N].bytes_written < w.bytes_written
        assert tail.store_prefix(long[:N]).cache_hit  # extents and tail both there


@pytest.mark.parametrize("standins", [(), (1,)])
def test_both_layouts_select_the_same_global_chunks_and_give_the_same_logits(daemon, gemma, standins):
    """A sliding layer's rows differ between the layouts only by rows its window masks, so the global layer's
    hidden state, its selection and the first token's logits are the same; with stand-in rows at the global
    layer too (its value sum and probe keys read from stored layer 0 in the window tail)."""
    gen = torch.Generator().manual_seed(9)
    prefix, suffix = torch.randint(0, 96, (N,), generator=gen), torch.randint(0, 96, (S,), generator=gen)
    cfg = CFG.replace(budget=0.3, standin_layers=standins)
    with KVStoreClient(daemon.target) as client:
        runs = []
        for window_tail in (None, False):
            runner = ModelRunner(gemma, client, probe_bits=4, window_tail=window_tail)
            runs.append(runner.reprefill(runner.store_prefix(prefix).prefix_id, suffix, cfg))
    tail, whole = runs
    loaded = sum(min(CT, N - c * CT) for c in tail.selected[1].tolist())
    assert tail.standin_rows == whole.standin_rows == (N - loaded if standins else 0)  # one stand-in per row left out
    assert tail.selected[1].tolist() == whole.selected[1].tolist() and len(tail.selected[1]) < M
    torch.testing.assert_close(tail.logits, whole.logits, rtol=1e-5, atol=1e-5)
    assert tail.bytes_useful < whole.bytes_useful


def test_a_window_tail_prefix_missing_its_tail_is_refused_then_healed_by_storing_it_again(daemon, gemma):
    gen = torch.Generator().manual_seed(8)
    prefix, suffix = torch.randint(0, 96, (N,), generator=gen), torch.randint(0, 96, (S,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(gemma, client)
        geo = runner.geometry
        res = client.put_prefix(prefix.numpy(), gemma.prefill(prefix)[1][[1]].numpy(), geo, model_fingerprint=gemma.fingerprint)
        with pytest.raises(TailMissing, match="store the prefix again"):
            runner.reprefill(res.prefix_id, suffix, CFG)
        handle = runner.store_prefix(prefix)
        assert handle.prefix_id == res.prefix_id and not handle.cache_hit
        fresh = ModelRunner(gemma, client)
        torch.testing.assert_close(
            fresh.reprefill(handle.prefix_id, suffix, CFG.replace(budget=1.0)).logits,
            gemma.forward_full(torch.cat([prefix, suffix]))[-1],
            rtol=1e-4,
            atol=1e-4,
        )


def test_answer_recomputes_a_prefix_whose_tail_is_gone_and_stores_the_tail_again(daemon, gemma):
    from engine_client.compute_model import AcceleratorProfile

    # compute dear, storage free: a loading path, which needs the tail
    slow_compute = AcceleratorProfile("slow-compute", 1e5, 1e5, 1e15, layer_overhead_s=1e-9, disk_bytes_per_s=1e15, period_overhead_s=1e-9)
    gen = torch.Generator().manual_seed(10)
    prefix, suffix = torch.randint(0, 96, (N,), generator=gen), torch.randint(0, 96, (S,), generator=gen)
    dense = gemma.forward_full(torch.cat([prefix, suffix]))[-1]
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(gemma, client)
        handle = runner.store_prefix(prefix)
        assert runner.answer(prefix, suffix, CFG, profile=slow_compute).path != "recompute"
        client.delete(handle.tail_batch_id)
        runner.forget(handle.prefix_id)
        ans = runner.answer(prefix, suffix, CFG, profile=slow_compute)
        assert ans.path == "recompute" and ans.reason == "the prefix's tail pages are not stored (its chunks are)"
        torch.testing.assert_close(ans.logits, dense, rtol=1e-4, atol=1e-4)
        assert ans.prefix.prefix_id == handle.prefix_id and ans.prefix.tail_batch_id  # the tail put again
        assert runner.answer(prefix, suffix, CFG, profile=slow_compute).path != "recompute"


def test_the_window_tail_is_refused_where_it_cannot_apply(daemon, gemma, tiny_model):
    with KVStoreClient(daemon.target) as client:
        with pytest.raises(InvalidArgument, match="group_layers"):
            ModelRunner(gemma, client, group_layers=3)
        assert ModelRunner(gemma, client, group_layers=3, window_tail=False).window is None
        with pytest.raises(InvalidArgument, match="window_tail: the model has no sliding-window layers"):
            ModelRunner(tiny_model, client, window_tail=True)
        assert ModelRunner(tiny_model, client).window is None


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
    """A sliding layer's Period computes on its window tail (48 rows), over the budget's 40 tokens by design:
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
    trace = ["--systems", "contiguouskv-perlayer", "--period-layers", "1", "--trace-out", str(tmp_path / "t.jsonl")]
    err = _zipf(gemma_dir, tmp_path, *trace, expect=1).stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kvstore-bench: error: --trace-out: tiny has sliding-window layers")


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


def test_the_choice_prices_the_stored_layers_periods_and_a_tail_not_yet_fetched(daemon, gemma):
    from engine_client.reprefill.choice import request_shape

    gen = torch.Generator().manual_seed(12)
    prefix, suffix = torch.randint(0, 96, (N,), generator=gen), torch.randint(0, 96, (S,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(gemma, client, probe_bits=4)
        handle = runner.store_prefix(prefix)
        before = request_shape(runner, N, S, handle.prefix_id, CFG)
        runner.reprefill(handle.prefix_id, suffix, CFG)
        after = request_shape(runner, N, S, handle.prefix_id, CFG)
    assert before.num_periods == after.num_periods == 1  # layer 1 is the one stored layer
    assert before.kv_bytes == runner.geometry.kv_bytes(N) == N * 2 * 2 * 16 * 4  # its K and V, 2 KV heads, float32
    assert before.tail_bytes == TAIL_ROWS * 4 * 2 * 16 * 4  # 2 sliding layers x 2 KV heads, K and V
    assert after.tail_bytes == 0  # resident once fetched


def test_warming_a_window_tail_prefix_fetches_its_tail_and_probes_ahead(daemon, gemma):
    gen = torch.Generator().manual_seed(13)
    prefix, suffix = torch.randint(0, 96, (N,), generator=gen), torch.randint(0, 96, (S,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        cold, warm = ModelRunner(gemma, client, probe_bits=4), ModelRunner(gemma, client, probe_bits=4)
        pid = cold.store_prefix(prefix).prefix_id
        fetched = warm.warm(pid, CFG)
        a, b = cold.reprefill(pid, suffix, CFG), warm.reprefill(pid, suffix, CFG)
    assert fetched == a.state_bytes_fetched + a.probe_bytes >= TAIL_ROWS * 4 * 2 * 16 * 4  # the tail, and layer 1's probe keys
    assert b.state_bytes_fetched == b.probe_bytes == 0
    torch.testing.assert_close(a.logits, b.logits, atol=0, rtol=0)
