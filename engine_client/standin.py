"""Stand-in rows: the prefix rows a Re-Prefill leaves out, at the layers that read all of them.

A few layers of a model read the whole prefix thinly rather than a few
chunks firmly: on SmolLM2-135M, one KV head of layer 19 spreads most of the
answer's attention over the haystack, a few points per chunk, so a 5% set
leaves out most of what it reads (layer 8 takes the next largest share of
the answer's margin).  Loading such a layer
in full costs a whole layer of the budget; what the rows left out
contribute is nearly their mean value, weighted by how much attention they
draw.  At a stand-in layer (``ReprefillConfig.standin_layers``) every row
not loaded therefore joins the attention with

- its key from the 4-bit probe keys the client already keeps for selection
  (``selection.probes``: no key is read for it), and
- as value, the mean value of the rows not loaded, per KV head: the
  layer's value sum over the whole prefix (read once per prefix and kept,
  ``Hkv x head_dim`` numbers) minus the loaded rows' values.

This is SparQ's mean-value reallocation, kept to the layers where it was
measured to help: applied at every layer it loses answers (the rows most
layers read carry values far from their mean), at layer 19 (and 8, at
2048 tokens) it restores most of the answer margin a 5% set takes (README, "Rows that stand
in for the prefix").
"""

from __future__ import annotations

import torch


def value_sum(values: torch.Tensor) -> torch.Tensor:
    """``[Hkv, d]`` float32: the sum over tokens of a layer's values ``[Hkv, n, d]``."""
    if values.dim() != 3:
        raise ValueError(f"values must be [kv_heads, tokens, head_dim], got shape {tuple(values.shape)}")
    return values.float().sum(dim=1)


def standin_kv(loaded: torch.Tensor, loaded_pos: torch.Tensor, probe_keys: torch.Tensor, values_sum: torch.Tensor) -> torch.Tensor:
    """The loaded rows, then one stand-in row per prefix position not loaded: ``[2, Hkv, n, d]``.

    ``loaded [2, Hkv, r, d]``: the rows the Re-Prefill loaded, at prefix
    positions ``loaded_pos [r]`` (distinct; on the host, where checking them
    waits on nothing).  ``probe_keys [Hkv, n, d]``: every
    prefix row's key (rotated, as stored; dequantized probe keys).
    ``values_sum [Hkv, d]``: the layer's value sum over all ``n`` rows.  A
    stand-in row has its own key and the mean value of the rows not loaded.
    Every row not loaded appears once; rows already loaded are not repeated.
    """
    if loaded.dim() != 4 or loaded.shape[0] != 2:
        raise ValueError(f"loaded must be [2, kv_heads, rows, head_dim], got shape {tuple(loaded.shape)}")
    hkv, r, d = loaded.shape[1:]
    if probe_keys.dim() != 3 or probe_keys.shape[0] != hkv or probe_keys.shape[2] != d:
        raise ValueError(f"probe_keys must be [{hkv}, tokens, {d}], got shape {tuple(probe_keys.shape)}")
    if tuple(values_sum.shape) != (hkv, d):
        raise ValueError(f"values_sum must be [{hkv}, {d}], got shape {tuple(values_sum.shape)}")
    n = probe_keys.shape[1]
    pos = loaded_pos.cpu()  # positions index; they are not computed on (the runner keeps them on the host)
    if loaded_pos.shape != (r,) or (r and (int(pos.min()) < 0 or int(pos.max()) >= n)):
        raise ValueError(f"loaded_pos must be {r} positions in [0, {n})")
    left = torch.ones(n, dtype=torch.bool)
    left[pos] = False
    num_left = int(left.sum())
    if num_left + r != n:
        raise ValueError("loaded_pos must not repeat a position")
    if num_left == 0:
        return loaded
    mean = (values_sum - loaded[1].float().sum(dim=1)) / num_left  # [Hkv, d]
    rest = torch.nonzero(left).squeeze(1).to(probe_keys.device)  # [n - r] positions not loaded, ascending
    keys = probe_keys.index_select(1, rest).to(loaded.dtype)  # [Hkv, n - r, d]
    values = mean.to(loaded.dtype)[:, None, :].expand(hkv, num_left, d)
    return torch.cat([loaded, torch.stack([keys, values])], dim=2)
