"""LoopServe's vertical-and-slash selection: the kept lines cover at least alpha of the observed attention."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.model.loader import load_checkpoint
from engine_client.sparse_prefill import line_mask, vertical_slash
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return load_checkpoint(str(path), dtype=torch.float32)


def random_probs(seed: int, heads: int, queries: int, keys: int, sharp: float):
    gen = torch.Generator().manual_seed(seed)
    q_pos = torch.arange(keys - queries, keys)
    scores = torch.randn(heads, queries, keys, generator=gen) * sharp
    causal = torch.arange(keys)[None, :] <= q_pos[:, None]
    return scores.masked_fill(~causal, float("-inf")).softmax(-1), q_pos


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    heads=st.integers(1, 3),
    queries=st.integers(1, 8),
    extra=st.integers(0, 40),
    sharp=st.floats(0.1, 6.0),
    alpha=st.floats(0.05, 1.0),
)
def test_the_kept_lines_cover_at_least_alpha_of_each_heads_mass(seed, heads, queries, extra, sharp, alpha):
    probs, q_pos = random_probs(seed, heads, queries, queries + extra, sharp)
    lines = vertical_slash(probs, q_pos, alpha)
    mask = line_mask(lines, q_pos, probs.shape[2])
    inside = (probs * mask).sum(dim=(1, 2)) / probs.sum(dim=(1, 2))
    assert (lines.covered >= alpha - 1e-5).all()
    assert (inside >= lines.covered - 1e-5).all()  # the mask holds what was counted (and each query's own key)
    assert not (mask & (torch.arange(probs.shape[2])[None, :] > q_pos[:, None])).any()  # never a future key


def walk(probs, q_pos, alpha):
    """The greedy walk written plainly: lines heaviest first, each adding the cells not held yet."""
    h, q, t = probs.shape
    offset = q_pos[:, None] - torch.arange(t)[None, :]
    causal = offset >= 0
    out = []
    for head in range(h):
        p = probs[head].double() * causal
        total = float(p.sum())
        lines = [(float(p[:, j].sum()), 0, j) for j in range(t)] + [
            (float(p[offset == o].sum()), 1, o) for o in range(int(offset.max()) + 1)
        ]
        lines.sort(key=lambda x: -x[0])  # stable: verticals first among equals
        mask, got, kept = torch.zeros(q, t, dtype=torch.bool), 0.0, ([], [])
        for mass, kind, idx in lines:
            if total == 0 or got >= alpha * total - 1e-9 * total or mass <= 0:
                break
            cells = (torch.arange(t)[None, :] == idx).expand(q, t) if kind == 0 else offset == idx
            new = cells & ~mask & causal
            if new.any():
                got += float(p[new].sum())
                mask |= new
                kept[kind].append(idx)
        out.append((sorted(kept[0]), sorted(kept[1]), got / total if total else 1.0))
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    queries=st.integers(1, 8),
    extra=st.integers(0, 40),
    sharp=st.floats(0.1, 6.0),
    alpha=st.floats(0.05, 1.0),
)
def test_the_lines_are_the_greedy_walks(seed, queries, extra, sharp, alpha):
    probs, q_pos = random_probs(seed, 2, queries, queries + extra, sharp)
    probs = (probs * 64).round() / 64  # coarse masses: ties between lines, lines adding cells of no mass
    lines = vertical_slash(probs, q_pos, alpha)
    for head, (vs, ss, got) in enumerate(walk(probs, q_pos, alpha)):
        assert lines.verticals[head].tolist() == vs and lines.slashes[head].tolist() == ss
        assert float(lines.covered[head]) == pytest.approx(got, abs=1e-6)


def test_a_sink_and_a_local_diagonal_are_found_as_one_vertical_and_one_slash():
    t, q = 32, 8
    q_pos = torch.arange(t - q, t)
    probs = torch.zeros(1, q, t)
    probs[0, :, 0] = 0.5  # the sink
    probs[0, torch.arange(q), q_pos - 1] = 0.5  # the previous token
    lines = vertical_slash(probs, q_pos, 0.99)
    assert lines.verticals[0].tolist() == [0] and lines.slashes[0].tolist() == [1]
    assert float(lines.covered[0]) == pytest.approx(1.0)
    half = vertical_slash(probs, q_pos, 0.5)
    assert len(half.verticals[0]) + len(half.slashes[0]) == 1


@pytest.mark.parametrize("alpha", [0.0, 1.5, float("nan"), True])
def test_alpha_outside_zero_one_is_refused(alpha):
    probs, q_pos = random_probs(0, 1, 2, 4, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        vertical_slash(probs, q_pos, alpha)


def test_query_positions_must_fit_the_keys():
    probs, _ = random_probs(0, 1, 2, 4, 1.0)
    with pytest.raises(ValueError, match="q_pos"):
        vertical_slash(probs, torch.tensor([3, 4]), 0.5)


def test_layer_keys_are_the_keys_layer_forward_makes(tiny):
    hidden = tiny.embed(torch.tensor([3, 4, 5]))
    pos = torch.tensor([7, 8, 9])
    _, kv = tiny.layer_forward(1, hidden, pos, None)
    torch.testing.assert_close(tiny.layer_keys(1, hidden, pos), kv[0])


def test_alpha_one_prefill_equals_the_dense_one_and_a_low_alpha_computes_less(tiny):
    from engine_client.generation import dense_generate

    prefix, suffix = torch.arange(3, 90), torch.arange(20, 44)
    full = dense_generate(tiny, prefix, suffix, 3)
    whole = dense_generate(tiny, prefix, suffix, 3, sparse_prefill=1.0)
    torch.testing.assert_close(whole.first_logits, full.first_logits, atol=1e-4, rtol=1e-4)
    low = dense_generate(tiny, prefix, suffix, 3, sparse_prefill=0.3)
    assert full.prefill_density is None and low.prefill_density < whole.prefill_density <= 1.0
