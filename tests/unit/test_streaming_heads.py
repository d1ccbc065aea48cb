"""Streaming heads: classification, row masks, masked attention against a brute-force softmax, the profile file."""

import json
import math
import subprocess
import sys

import pytest
import torch

from engine_client.generation import dense_generate
from engine_client.model.kernels import _gqa_attention
from engine_client.model.loader import load_checkpoint
from engine_client.model.streaming import PROFILE_VERSION, ProfileError, StreamingHeads, calibrate, classify, local_mass
from engine_client.prefill import chunked_prefill
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return load_checkpoint(str(path), dtype=torch.float32)


def profile(streaming, *, sink=2, recent=3, fingerprint="fp"):
    mass = tuple(tuple(0.9 if s else 0.1 for s in layer) for layer in streaming)
    return StreamingHeads(fingerprint, sink, recent, 0.5, 0.5, mass, tuple(tuple(layer) for layer in streaming), {"how": "test"})


def test_classify_takes_the_most_local_heads_above_the_threshold_up_to_the_fraction():
    mass = torch.tensor([[0.9, 0.2, 0.6], [0.95, 0.55, 0.4]])
    assert classify(mass, 0.5, 0.5) == [[True, False, True], [True, False, False]]  # 3 of 6: 0.95, 0.9, 0.6
    assert classify(mass, 0.5, 1.0) == [[True, False, True], [True, True, False]]  # every head >= 0.5
    assert classify(mass, 0.99, 1.0) == [[False] * 3, [False] * 3]
    assert classify(mass, 0.0, 0.0) == [[False] * 3, [False] * 3]


def test_classify_half_converts_exactly_the_top_half():
    mass = torch.rand(6, 4, generator=torch.Generator().manual_seed(0))
    chosen = classify(mass, 0.0, 0.5)
    picked = sorted(float(mass[i, j]) for i in range(6) for j in range(4) if chosen[i][j])
    rest = [float(mass[i, j]) for i in range(6) for j in range(4) if not chosen[i][j]]
    assert len(picked) == 12 and min(picked) >= max(rest)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_classify_refuses_out_of_range_values(bad):
    with pytest.raises(ValueError, match="threshold"):
        classify(torch.zeros(1, 1), bad, 0.5)
    with pytest.raises(ValueError, match="target_fraction"):
        classify(torch.zeros(1, 1), 0.5, bad)


def test_row_mask_keeps_sink_and_recent_rows_for_streaming_heads_only():
    prof = profile([[True, False], [False, False]], sink=2, recent=3)
    pos = torch.tensor([0, 1, 2, 5, 6, 7, 9])
    mask = prof.row_mask(0, pos, num_prefix=10)
    assert mask[0].tolist() == [True, True, False, False, False, True, True]  # < 2 or >= 7
    assert mask[1].all()
    assert prof.row_mask(1, pos, num_prefix=10) is None  # no streaming head in layer 1


def brute_force(q, keys, values, r, row_mask):
    hq, s, d = q.shape
    g = hq // keys.shape[0]
    out = torch.empty_like(q)
    for h in range(hq):
        kh = h // g
        for i in range(s):
            visible = [j for j in range(r) if row_mask[kh, j]] + list(range(r, r + i + 1))
            scores = torch.stack([q[h, i] @ keys[kh, j] for j in visible]) / math.sqrt(d)
            p = scores.softmax(0)
            out[h, i] = sum(p[t] * values[kh, j] for t, j in enumerate(visible))
    return out


@pytest.mark.parametrize("s", [1, 4])
def test_masked_attention_equals_a_brute_force_softmax_over_each_heads_visible_rows(s):
    gen = torch.Generator().manual_seed(s)
    hq, hkv, r, d = 6, 2, 9, 8
    q = torch.randn(hq, s, d, generator=gen)
    keys, values = torch.randn(hkv, r + s, d, generator=gen), torch.randn(hkv, r + s, d, generator=gen)
    row_mask = torch.rand(hkv, r, generator=gen) > 0.5
    row_mask[:, 0] = True
    got = _gqa_attention(q, keys, values, r, row_mask)
    torch.testing.assert_close(got, brute_force(q, keys, values, r, row_mask), atol=1e-5, rtol=1e-5)


def test_a_mask_hiding_the_same_rows_for_every_head_equals_dropping_those_rows(tiny):
    tokens = torch.arange(3, 43)
    _, kv = chunked_prefill(tiny, tokens)
    suffix = torch.tensor([5, 6, 7])
    keep = torch.tensor([0, 1, 2, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39])
    hkv = tiny.config.num_key_value_heads
    every = StreamingHeads(tiny.fingerprint, 3, 10, 0.0, 1.0, ((1.0,) * hkv,) * tiny.num_layers, ((True,) * hkv,) * tiny.num_layers)
    masked = dense_generate(tiny, tokens, suffix, 4, prefix_kv=kv, streaming=every)
    dropped = dense_generate(tiny, tokens, suffix, 4, prefix_kv=kv, keep_rows=keep)
    torch.testing.assert_close(masked.first_logits, dropped.first_logits, atol=1e-4, rtol=1e-4)
    assert masked.tokens == dropped.tokens
    none = StreamingHeads(tiny.fingerprint, 3, 10, 1.0, 0.0, ((0.0,) * hkv,) * tiny.num_layers, ((False,) * hkv,) * tiny.num_layers)
    full = dense_generate(tiny, tokens, suffix, 4, prefix_kv=kv)
    assert dense_generate(tiny, tokens, suffix, 4, prefix_kv=kv, streaming=none).tokens == full.tokens
    torch.testing.assert_close(full.first_logits, dense_generate(tiny, tokens, suffix, 4, prefix_kv=kv, streaming=none).first_logits)


def test_local_mass_is_a_fraction_and_everything_is_local_when_the_window_covers_the_prefix(tiny):
    tokens = torch.arange(3, 35)
    _, kv = chunked_prefill(tiny, tokens)
    suffix = torch.tensor([9, 10])
    mass = local_mass(tiny, kv, suffix, sink_tokens=1, recent_tokens=2)
    assert mass.shape == (tiny.num_layers, tiny.config.num_key_value_heads)
    assert ((mass > 0) & (mass < 1)).all()
    whole = local_mass(tiny, kv, suffix, sink_tokens=0, recent_tokens=tokens.numel())
    torch.testing.assert_close(whole, torch.ones_like(whole))


def test_calibrate_records_how_it_was_made_and_round_trips_through_its_file(tiny, tmp_path):
    prompts = [(torch.arange(3, 40), torch.tensor([4, 5])), (torch.arange(10, 50), torch.tensor([6]))]
    prof = calibrate(tiny, prompts, sink_tokens=2, recent_tokens=4, threshold=0.0, target_fraction=0.5, calibration={"tasks": ["x"]})
    assert prof.calibration == {"tasks": ["x"], "prompts": 2}
    assert prof.num_streaming == (tiny.num_layers * tiny.config.num_key_value_heads) // 2
    path = prof.save(tmp_path / "streaming_heads.json")
    assert StreamingHeads.load(path, model=tiny) == prof
    assert prof.stored_fraction(1000) == pytest.approx(1 - prof.fraction * (1 - 6 / 1000))


def test_a_profile_for_another_model_version_or_shape_is_refused(tiny, tmp_path):
    hkv = tiny.config.num_key_value_heads
    prof = StreamingHeads("other", 1, 1, 0.5, 0.5, ((0.5,) * hkv,) * tiny.num_layers, ((False,) * hkv,) * tiny.num_layers)
    path = prof.save(tmp_path / "p.json")
    with pytest.raises(ProfileError, match="calibrated for model"):
        StreamingHeads.load(path, model=tiny)
    raw = json.loads(path.read_text())
    raw["version"] = PROFILE_VERSION + 1
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match="version"):
        StreamingHeads.load(path)
    path.write_text("{")
    with pytest.raises(ProfileError, match="malformed"):
        StreamingHeads.load(path)
    with pytest.raises(ProfileError, match="no streaming heads file"):
        StreamingHeads.load(tmp_path / "absent.json")


def test_row_mask_of_the_wrong_shape_is_refused(tiny):
    hidden = tiny.embed(torch.tensor([1, 2]))
    prefix = torch.zeros(2, tiny.config.num_key_value_heads, 5, tiny.config.head_dim)
    with pytest.raises(ValueError, match="row_mask"):
        tiny.layer_forward(0, hidden, torch.tensor([5, 6]), prefix, torch.ones(1, 4, dtype=torch.bool))


def test_calibrate_heads_command_refuses_bad_flags_in_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.models", "calibrate-heads", "smollm2-135m", "--threshold", "2"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "must be in [0, 1]" in out.stderr and "Traceback" not in out.stderr


def test_the_zoo_finds_the_file_next_to_the_checkpoint_or_names_the_command(tiny, tmp_path):
    from engine_client.model import zoo
    from engine_client.model.streaming import PROFILE_FILE

    pm = zoo.PretrainedModel(tiny.config, tiny, None, tmp_path / "smollm2-135m-float32-x")
    pm.checkpoint_dir.mkdir()
    with pytest.raises(ProfileError, match="calibrate-heads smollm2-135m"):
        zoo.streaming_heads(pm)
    hkv = tiny.config.num_key_value_heads
    prof = StreamingHeads(tiny.fingerprint, 1, 1, 0.5, 0.5, ((0.5,) * hkv,) * tiny.num_layers, ((True,) * hkv,) * tiny.num_layers)
    prof.save(pm.checkpoint_dir / PROFILE_FILE)
    assert zoo.streaming_heads(pm) == prof


def test_the_accuracy_bench_knows_the_streaming_path():
    from kvstore_tools.bench.text_accuracy import parse_paths

    assert parse_paths("full,full-streaming") == [("full", "", 1.0), ("full-streaming", "", 1.0)]


def test_the_accuracy_bench_knows_the_sparse_prefill_path():
    from kvstore_tools.bench.text_accuracy import parse_paths

    assert parse_paths("sparse-prefill@0.95") == [("sparse-prefill@0.95", "sparse-prefill", 0.95)]
    with pytest.raises(ValueError):
        parse_paths("sparse-prefill@1.5")
    from kvstore_tools.bench.text_accuracy import check_store_probe_bits

    check_store_probe_bits(parse_paths("sparse-prefill@0.9,perlayer-follow-int4@0.05"), 4, 8)  # no probe keys read
