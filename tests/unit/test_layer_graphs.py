"""A decoder layer's parts before and after attention replayed as CUDA graphs: the same outputs as launching
every kernel, across requests (new positions), suffix lengths and loaded-row counts; eager on a CPU."""

import pytest
import torch

from engine_client.model import graphs
from engine_client.model.loader import load_checkpoint
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return str(path)


def test_a_cpu_decoder_launches_every_kernel(tiny_dir):
    model = load_checkpoint(tiny_dir, dtype=torch.float32)
    assert model.layer_graphs is None
    model.use_layer_graphs(True)
    assert model.layer_graphs is None


def _layers(model, hidden, start, rows, seed):
    """Every layer over ``rows`` random prefix rows, suffix at ``start``: (hidden out, suffix KV) per layer."""
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    positions = model.position_range(start, hidden.shape[0])
    out = []
    for layer in range(model.num_layers):
        prefix = torch.randn(2, c.num_key_value_heads, rows, c.head_dim, generator=gen).to(model.device, model.dtype) if rows else None
        hidden, kv = model.layer_forward(layer, hidden, positions, prefix)
        out.append((hidden, kv))
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_graphed_layers_match_eager_ones_on_cuda(tiny_dir, dtype, atol):
    graphed = load_checkpoint(tiny_dir, dtype=dtype, device="cuda")
    eager = load_checkpoint(tiny_dir, dtype=dtype, device="cuda")
    eager.use_layer_graphs(False)
    assert graphed.layer_graphs is not None and eager.layer_graphs is None
    gen = torch.Generator().manual_seed(0)
    kept = None
    for s, start, rows in ((7, 300, 40), (7, 900, 13), (64, 500, 0), (7, 42, 42), (graphs.MAX_TOKENS + 1, 10, 5)):
        hidden = torch.randn(s, graphed.config.hidden_size, generator=gen).to("cuda", dtype)
        want = _layers(eager, hidden, start, rows, seed=s + rows)
        got = _layers(graphed, hidden, start, rows, seed=s + rows)
        for (h_got, kv_got), (h_want, kv_want) in zip(got, want):
            torch.testing.assert_close(h_got, h_want, atol=atol, rtol=atol)
            torch.testing.assert_close(kv_got, kv_want, atol=atol, rtol=atol)
        if kept is None:
            kept = (got[-1][0], got[-1][0].clone())  # a returned output is the caller's: later replays leave it alone
    assert torch.equal(*kept)
    assert graphed.layer_graphs.captures == 2 * graphed.num_layers * 2  # suffixes of 7 and 64 tokens; 257 runs eagerly
