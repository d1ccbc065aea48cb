"""Re-Prefill of Gemma 3 270M through a real daemon: a pass key past the sliding window.

A 1.5k-token prefix is three windows long: at a budget of every chunk the
Re-Prefill is the dense forward (each sliding layer over the prefix's window
tail, its last 512 rows, only), and the default system at 10% of the chunks
answers the pass key.  The store holds the 3 global layers as extents.  The
stand-in calibration shipped for this model found no layer worth it: the
default runs without stand-in rows, by calibration.
"""

import pytest
import torch
from pretrained import needs_gemma3

from engine_client.client import KVStoreClient
from engine_client.generation import dense_generate
from engine_client.model import zoo
from engine_client.model.selection_profile import packaged_selection
from engine_client.model.standins import packaged_standins
from engine_client.reprefill import ModelRunner, ReprefillConfig
from engine_client.reprefill.checks import describe
from engine_client.selection import window_chunk_count
from kvstore.contract import InvalidArgument
from kvstore_tools.tasks import text

# the 270M model's export (~40 s on a fresh machine) and a 1.5k-token dense reference on 2 cores
pytestmark = [needs_gemma3, pytest.mark.slow]
TOKENS = 1500


@pytest.fixture(scope="module")
def gemma3():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return zoo.load("gemma3-270m", dtype=torch.float32)


def test_full_budget_is_dense_and_ten_percent_answers_the_pass_key(daemon, gemma3):
    (ex,) = text.examples("passkey", gemma3.tokenizer, 1, TOKENS, stream="tune", start=1)
    assert ex.prefix_tokens[0] == gemma3.tokenizer.bos_token_id  # the model's <bos> first
    model = gemma3.decoder
    shipped = packaged_standins(model)
    assert shipped is not None and shipped.layers == () and shipped.calibration["task"] == "niah"
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(model, client)
        assert runner.standin_profile == shipped and not runner.calibrated_layers(ReprefillConfig()).missing_calibration
        handle = runner.store_prefix(ex.prefix_tokens)
        full = runner.reprefill(handle.prefix_id, ex.suffix_tokens, ReprefillConfig().replace(budget=1.0, report_attention=False))
        cfg = ReprefillConfig().replace(budget=0.10)
        gen = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, 8, tokenizer=gemma3.tokenizer)
        # the shipped selection profile: only the best chunk of a global layer brings the chunk after it, 8-bit
        # probe keys (stored so by the runner), and no last chunk forced into a global layer's set
        assert runner.selection_profile == packaged_selection(model) and runner.follow_top(cfg) == 1
        assert runner.geometry.probe_bits == 8 and describe(client, handle.prefix_id).geometry.probe_bits == 8
        explicit = runner.reprefill(
            handle.prefix_id, ex.suffix_tokens, cfg.replace(follow_top=1, probe_bits=8, local_chunks=0, report_attention=False)
        )
        assert [c.tolist() for c in explicit.selected] == [c.tolist() for c in gen.reprefill.selected]
        with pytest.raises(InvalidArgument, match="probe_bits"):  # the store's 8-bit keys are not 4-bit ones
            runner.reprefill(handle.prefix_id, ex.suffix_tokens, cfg.replace(probe_bits=4))
    dense = dense_generate(model, ex.prefix_tokens, ex.suffix_tokens, 8, tokenizer=gemma3.tokenizer)
    torch.testing.assert_close(full.logits, dense.first_logits, rtol=1e-4, atol=5e-4)
    assert ex.is_correct(dense.text) and ex.is_correct(gen.text), (ex.depth, dense.text, gen.text)
    assert runner.geometry.model.num_layers == 3 and runner.layers.layers == (5, 11, 17)  # the global layers' extents
    n, m = len(ex.prefix_tokens), handle.num_chunks
    plan = runner.plan(m, cfg, cfg.budget, num_tokens=n)
    window = torch.unique(torch.arange(n - 512, n) // 16).tolist()  # the tail's chunks: 33, not 94
    assert len(window) < window_chunk_count(n, 512, 16) + 2
    for layer, chunks in enumerate(gen.reprefill.selected):
        if model.config.window_of(layer) is not None:
            assert chunks.tolist() == window
        else:
            assert len(chunks) == plan.periods[layer][2] < len(window)
    assert gen.reprefill.reported_units > 0
