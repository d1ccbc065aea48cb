"""The decoder's attention (fused-kernel paths) against an explicit masked softmax.

Each branch of ``_gqa_attention`` is checked: dense (``is_causal``), one new
token (no mask), and suffix over ``r`` prefix rows (on a CPU two unmasked
calls joined by their log-sum-exps, elsewhere a boolean mask), on odd
shapes and GQA ratios, in float32 and bfloat16.  The reference materializes
the mask, repeats KV heads and runs the softmax per head in float64, the way
the decoder computed attention before the fused kernels.
"""

import math

import pytest
import torch

from engine_client.model.kernels import _gqa_attention


def reference(q, keys, values, r):
    hq, s, d = q.shape
    g = hq // keys.shape[0]
    k = keys.double().repeat_interleave(g, dim=0)  # [Hq, r+s, d]
    v = values.double().repeat_interleave(g, dim=0)
    mask = torch.ones(s, r + s, dtype=torch.bool)
    mask[:, r:] = torch.ones(s, s, dtype=torch.bool).tril()
    scores = q.double() @ k.transpose(1, 2) / math.sqrt(d)  # [Hq, s, r+s]
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v  # [Hq, s, d]


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "hq,hkv,d,r,s",
    [
        (9, 3, 16, 0, 37),  # dense prefill
        (4, 4, 4, 0, 5),  # no GQA, head dim 4
        (3, 1, 8, 0, 1),  # one token alone
        (9, 3, 16, 23, 1),  # one new token over a prefix
        (9, 3, 16, 23, 7),  # suffix over prefix rows
        (6, 2, 1, 5, 3),  # head dim 1
        (2, 1, 8, 1, 64),  # suffix longer than the prefix
        (9, 3, 64, 700, 300),  # a prefill block over earlier blocks (SmolLM2's heads)
    ],
)
def test_attention_matches_masked_softmax(hq, hkv, d, r, s, dtype, atol):
    gen = torch.Generator().manual_seed(hq * 1000 + r * 10 + s)
    q = (torch.randn(hq, s, d, generator=gen) * 2).to(dtype)
    keys = (torch.randn(hkv, r + s, d, generator=gen) * 2).to(dtype)
    values = torch.randn(hkv, r + s, d, generator=gen).to(dtype)
    with torch.inference_mode():
        got = _gqa_attention(q, keys, values, r)
    assert got.shape == (hq, s, d) and got.dtype == dtype
    # bfloat16: up to one rounding of the output (8e-3 relative) besides the absolute bound
    rtol = 0 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got.double(), reference(q, keys, values, r), atol=atol, rtol=rtol)


def test_suffix_queries_do_not_see_later_suffix_keys():
    """A changed last key/value must not change any earlier query's output (the mask is bottom-right aligned)."""
    hq, hkv, d, r, s = 4, 2, 8, 6, 5
    gen = torch.Generator().manual_seed(1)
    q, keys, values = (
        torch.randn(hq, s, d, generator=gen),
        torch.randn(hkv, r + s, d, generator=gen),
        torch.randn(hkv, r + s, d, generator=gen),
    )
    base = _gqa_attention(q, keys, values, r)
    keys2, values2 = keys.clone(), values.clone()
    keys2[:, -1] += 5
    values2[:, -1] -= 5
    moved = _gqa_attention(q, keys2, values2, r)
    assert torch.equal(base[:, :-1], moved[:, :-1])
    assert not torch.allclose(base[:, -1], moved[:, -1])


@pytest.mark.parametrize("dtype,atol,rtol", [(torch.float32, 1e-5, 0), (torch.bfloat16, 1e-2, 8e-3)])
def test_prefix_then_causal_matches_the_masked_kernel(dtype, atol, rtol):
    """The CPU split (prefix rows, then the causal block) gives the boolean-mask kernel's output."""
    from engine_client.model import kernels

    if kernels._FLASH_CPU is None:
        pytest.skip("this torch has no fused CPU attention kernel")
    gen = torch.Generator().manual_seed(7)
    hq, hkv, d, r, s = 9, 3, 64, 1500, 256
    q = torch.randn(1, hq, s, d, generator=gen).to(dtype)
    k = (torch.randn(1, hkv, r + s, d, generator=gen) * 3).to(dtype)
    v = torch.randn(1, hkv, r + s, d, generator=gen).to(dtype)
    mask = kernels._attention_mask(r, s, q.device)
    with torch.inference_mode():
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        got = kernels._prefix_then_causal(q, k, v, r)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)  # bfloat16: one more rounding


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")
@pytest.mark.parametrize(
    "hq,hkv,d,r,s",
    [
        (14, 2, 64, 819, 64),  # Qwen2.5-0.5B heads, 5% of a 16k prefix
        (32, 8, 128, 819, 64),  # Llama-3-8B heads
        (9, 3, 64, 700, 300),  # SmolLM2's heads, a suffix longer than usual
        (4, 4, 40, 23, 7),  # no GQA, a head dim flash pads
    ],
)
def test_the_cuda_lower_right_path_matches_masked_softmax(hq, hkv, d, r, s):
    """bf16 on CUDA: suffix over prefix rows through the bottom-right causal bias (no mask built), which must run."""
    from engine_client.model import kernels

    gen = torch.Generator().manual_seed(hq * 7 + r)
    q = (torch.randn(hq, s, d, generator=gen) * 2).to(torch.bfloat16)
    keys = (torch.randn(hkv, r + s, d, generator=gen) * 2).to(torch.bfloat16)
    values = torch.randn(hkv, r + s, d, generator=gen).to(torch.bfloat16)
    with torch.inference_mode():
        got = _gqa_attention(q.cuda(), keys.cuda(), values.cuda(), r)
    assert kernels._LOWER_RIGHT["ok"], "the lower-right causal bias fell back to a boolean mask on this CUDA build"
    assert got.device.type == "cuda" and got.shape == (hq, s, d)
    torch.testing.assert_close(got.cpu().double(), reference(q, keys, values, r), atol=2e-2, rtol=8e-3)


def test_the_lower_right_fallback_gives_the_masked_result(monkeypatch):
    """Where the bias cannot run, the boolean mask answers the same, and the path is not tried again."""
    from engine_client.model import kernels

    def refuse(*args, **kwargs):
        if isinstance(kwargs.get("attn_mask"), torch.Tensor):
            return sdpa(*args, **kwargs)
        raise RuntimeError("no kernel for this bias")

    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", refuse)
    monkeypatch.setitem(kernels._LOWER_RIGHT, "ok", True)
    gen = torch.Generator().manual_seed(3)
    q4 = torch.randn(1, 6, 5, 8, generator=gen)
    k4, v4 = torch.randn(1, 2, 17, 8, generator=gen), torch.randn(1, 2, 17, 8, generator=gen)
    with torch.inference_mode():
        got = kernels._lower_right_causal(q4, k4, v4, 12)
    assert kernels._LOWER_RIGHT["ok"] is False
    torch.testing.assert_close(got[0].double(), reference(q4[0], k4[0], v4[0], 12), atol=1e-5, rtol=0)
