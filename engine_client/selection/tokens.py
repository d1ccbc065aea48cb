"""Token-level selection of the baselines that store 64-token blocks.

* AS+H2O (AttentionStore with H2O's heavy hitters): query-agnostic; a
  token's importance is the attention it accumulated at the end of prefill,
  here from the prefix's last ``window`` tokens (an observation window) at
  each Period's first layer.
* IMPRESS: query-aware; the suffix queries of the period's first layer
  against that layer's prefix keys (the probe keys, read from the store).

Both then load 64-token blocks: ``cover`` loads every block holding a
selected token (AS+H2O), ``dense`` takes the blocks whose selected tokens
carry the most attention until the token budget is loaded (IMPRESS).  The selected
tokens are returned too, so the caller can report tokens loaded per token
wanted.
"""

from __future__ import annotations

import math
import numbers

import torch

from kvstore.errors import InvalidArgument

from .exact import token_attention_mass


@torch.inference_mode()
def h2o_token_scores(model, kv: torch.Tensor, tokens: torch.Tensor, *, period_layers: int, window: int = 64) -> torch.Tensor:
    """``[periods, n]``: attention each prefix token receives from the last ``window`` tokens.

    ``kv``: the prefix's ``[layers, 2, Hkv, n, d]`` (post-RoPE keys, as
    stored).  The window's hidden states at each period's first layer are
    recomputed from its own tokens attending to the stored KV before it,
    so nothing but the window is run again.
    """
    n = kv.shape[3]
    if tokens.numel() != n:
        raise InvalidArgument("tokens", f"has {tokens.numel()} tokens, the KV {n}")
    if period_layers < 1:
        raise InvalidArgument("period_layers", "must be positive")
    w = min(window, n)
    start = n - w
    positions = torch.arange(start, n)
    hidden = model.embed(tokens[start:])
    out = []
    for l0 in range(model.num_layers):
        if l0 % period_layers == 0:
            q = model.layer_queries(l0, hidden, positions)  # [Hq, w, d]
            out.append(_causal_window_mass(q, kv[l0, 0], start))
        hidden, _ = model.layer_forward(l0, hidden, positions, kv[l0, :, :, :start] if start else None)
    return torch.stack(out)


def _causal_window_mass(q: torch.Tensor, keys: torch.Tensor, start: int) -> torch.Tensor:
    """Softmax mass per key from window queries at positions ``start..``, each seeing keys up to itself."""
    hq, w, d = q.shape
    hkv, n, _ = keys.shape
    k = keys.float().repeat_interleave(hq // hkv, dim=0)  # [Hq, n, d]
    logits = torch.einsum("hwd,hnd->hwn", q.float(), k) / math.sqrt(d)  # [Hq, w, n]
    visible = torch.arange(n)[None, :] <= (start + torch.arange(w))[:, None]  # [w, n]
    logits = logits.masked_fill(~visible, float("-inf"))
    return torch.softmax(logits, dim=-1).sum(dim=(0, 1))  # [n]


def impress_token_scores(queries: torch.Tensor, probe_keys: torch.Tensor) -> torch.Tensor:
    """``[n]``: softmax mass per prefix token of the suffix queries on the probe keys."""
    return token_attention_mass(queries, probe_keys)


def token_budget(n: int, budget) -> int:
    if isinstance(budget, bool):
        raise InvalidArgument("budget", f"must be a fraction in (0, 1] or a token count, got {budget!r}")
    if isinstance(budget, numbers.Integral):
        if not 1 <= budget <= n:
            raise InvalidArgument("budget", f"token count {budget} out of range [1, {n}]")
        return int(budget)
    if isinstance(budget, numbers.Real) and 0 < budget <= 1:
        return max(1, math.ceil(round(float(budget) * n, 9)))
    raise InvalidArgument("budget", f"must be a fraction in (0, 1] or a token count, got {budget!r}")


def select_blocks_for_tokens(
    token_scores: torch.Tensor,
    budget,
    *,
    block_tokens: int = 64,
    sink_blocks: int = 1,
    local_blocks: int = 1,
    mode: str = "cover",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(blocks, selected tokens)``, both ascending ``LongTensor``; see the module docstring."""
    if token_scores.dim() != 1 or token_scores.numel() == 0:
        raise InvalidArgument("token_scores", f"expected [tokens >= 1], got shape {tuple(token_scores.shape)}")
    if block_tokens < 1:
        raise InvalidArgument("block_tokens", "must be positive")
    if mode not in ("cover", "dense"):
        raise InvalidArgument("mode", f"must be cover or dense, got {mode!r}")
    n = token_scores.numel()
    m = -(-n // block_tokens)
    k = token_budget(n, budget)
    scores = token_scores.float()
    order = torch.sort(scores, descending=True, stable=True).indices[:k]
    selected = torch.sort(order).values
    forced = set(range(min(sink_blocks, m))) | set(range(max(0, m - local_blocks), m))
    if mode == "cover":
        chosen = set((selected // block_tokens).tolist()) | forced
    else:
        block_of = selected // block_tokens
        counts = torch.bincount(block_of, minlength=m)
        mass = torch.zeros(m).index_add_(0, block_of, scores[selected])
        ranked = sorted(range(m), key=lambda b: (-float(mass[b]), -int(counts[b]), b))
        # the sink and local blocks come free (as sink and local chunks count
        # for the chunk systems); the budget buys the densest other blocks
        chosen = set(forced)
        want = k - int(sum(counts[b] for b in forced))
        loaded = 0
        for b in ranked:
            if b in chosen:
                continue
            if counts[b] == 0 or (loaded >= want and loaded > 0):
                break
            chosen.add(b)
            loaded += min(block_tokens, n - b * block_tokens)
    return torch.tensor(sorted(chosen), dtype=torch.long), selected
