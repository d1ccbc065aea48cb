"""A conversation's attention statistics for Krul, gathered without keeping any ``n x n`` map.

Two statistics per layer, both defined on the layer's causal attention map
``A [heads, n, n]`` (row ``i`` is the softmax of query ``i`` over keys
``0..i``; what ``Decoder`` computes, one map per query head):

* **the pooled map** ``P [heads, Gq, Gk]`` (``pooled_attention``): the mean
  of ``A`` over the cells of a fixed grid.  Bin ``b`` of an axis covers
  positions ``[b*w, (b+1)*w)``, with the bin width ``w`` the smallest power
  of two such that ``Gq`` (or ``Gk``) bins of ``w`` tokens cover the ``n``
  positions; bins past ``n`` are empty and read 0.  A cell's mean is over all
  its ``rows x cols`` entries, the zeros above the diagonal included.  Power
  of two widths are what make the map foldable one row at a time: when the
  conversation outgrows the grid, adjacent bins merge in pairs (sums are
  exact under merging), so the sketch ends with exactly the grid that pooling
  the whole map at once gives.
* **the edge mass** (``edge_mass``): for each row, the attention on the
  initial ``e`` keys plus the attention on the most recent ``e`` keys the row
  sees, ``e = ceil(t / 10)`` for a row that sees ``t`` keys (at least 1: the
  first 10% and the last 10% of its keys); averaged over heads and rows, so
  it lies in ``[0, 2]`` (both windows are counted in full where they
  overlap, as in the first rows).  The windows are relative to each row, so
  a row's contribution is final when the row arrives: a decode step adds its
  row and nothing earlier changes.

``AttentionSketch`` keeps, per layer, the grid's sums (``[heads, Gq, Gk]``
float64), the rows folded per row bin (``[Gq]`` float64), the two bin
widths, the rows covered and the edge mass sum (float64):
``num_layers * (heads * Gq * Gk + Gq) * 8`` bytes plus a few numbers per
layer (``nbytes``), e.g. 2.1 MiB for 30 layers, 9 heads and a 32 x 32 grid,
whatever the conversation's length.  Adding rows costs
``O(heads x rows x keys)`` time and the memory of the rows given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstore.contract import InvalidArgument

from ._checks import check_int, check_tensor

EDGE_DIVISOR = 10  # the initial and the recent windows are each ceil(t / 10) of the t keys a row sees


def edge_tokens(visible: torch.Tensor) -> torch.Tensor:
    """Window size ``e = ceil(t / EDGE_DIVISOR)`` for rows that see ``visible = t >= 1`` keys (``LongTensor``)."""
    return (visible + EDGE_DIVISOR - 1) // EDGE_DIVISOR


def grid_shape(grid: int | tuple[int, int]) -> tuple[int, int]:
    """``(Gq, Gk)`` from an int (square grid) or a pair, each in ``[1, 4096]``."""
    if isinstance(grid, tuple) and len(grid) == 2:
        return check_int("grid", grid[0], 1, 4096), check_int("grid", grid[1], 1, 4096)
    if isinstance(grid, tuple):
        raise InvalidArgument("grid", f"expected an int or a pair (rows, cols), got {grid!r}")
    size = check_int("grid", grid, 1, 4096)
    return size, size


def bin_width(num_positions: int, num_bins: int) -> int:
    """The smallest power of two ``w`` with ``num_bins * w >= num_positions``."""
    width = 1
    while num_bins * width < num_positions:
        width *= 2
    return width


def _bin_sizes(num_positions: int, num_bins: int, width: int) -> torch.Tensor:
    """Positions in each bin, ``[num_bins]`` float64: ``w`` for full bins, less for the last, 0 past the end."""
    starts = torch.arange(num_bins, dtype=torch.float64) * width
    return (num_positions - starts).clamp(0, width)


def _cell_means(sums: torch.Tensor, rows: torch.Tensor, num_positions: int, key_width: int) -> torch.Tensor:
    """``sums [heads, Gq, Gk]`` over ``rows [Gq]`` (rows folded per row bin) x each key bin's size; empty cells read 0; float32."""
    cols = _bin_sizes(num_positions, sums.shape[2], key_width)
    area = rows[:, None] * cols[None, :]  # [Gq, Gk]
    return torch.where(area > 0, sums / area.clamp(min=1), 0.0).float()


def _row_block_sums(attn: torch.Tensor, rows: torch.Tensor, shape: tuple[int, int], widths: tuple[int, int]) -> torch.Tensor:
    """Sums ``[heads, Gq, Gk]`` float64 of the rows ``attn [heads, q, k]`` at positions ``rows [q]``.

    Each row's key bins are summed in ``attn``'s dtype (at most ``w`` terms
    of a row that sums to 1), the rest in float64.  Key bins are contiguous,
    so the full ones are a view ``[heads, q, k // w, w]`` summed over its
    last axis: about 8x faster than an ``index_add_`` over the keys.
    """
    heads, q, k = attn.shape
    width = widths[1]
    full = k // width
    per_row = attn.new_zeros(heads, q, shape[1])  # [heads, q, Gk]
    per_row[..., :full] = attn[..., : full * width].view(heads, q, full, width).sum(-1)
    if full * width < k:
        per_row[..., full] = attn[..., full * width :].sum(-1)
    row_bins = rows // widths[0]
    return torch.zeros(heads, *shape, dtype=torch.float64).index_add_(1, row_bins, per_row.double())


def _edge_sum(attn: torch.Tensor, rows: torch.Tensor) -> float:
    """Sum over heads and rows of the initial plus recent window mass of ``attn [heads, q, k]`` (positions ``rows [q]``).

    Only the columns some row's window covers are read (the first
    ``max e`` and the band ``[min(t - e), k)``, about a fifth of a long
    row), in float64.
    """
    k = attn.shape[2]
    if rows.numel() == 0:
        return 0.0
    visible = rows + 1  # [q] keys each row sees
    e = edge_tokens(visible)
    widest = int(e.max())
    initial = (torch.arange(widest)[None, :] < e[:, None]).double()  # [q, widest]
    low = int((visible - e).min())
    keys = torch.arange(low, k)
    recent = ((keys[None, :] >= (visible - e)[:, None]) & (keys[None, :] < visible[:, None])).double()  # [q, k - low]
    total = (attn[..., :widest].double() * initial).sum() + (attn[..., low:].double() * recent).sum()
    return float(total)  # overlapping windows count twice


def _check_square(attn: object) -> torch.Tensor:
    attn = check_tensor("attn", attn, 3)
    if attn.shape[1] != attn.shape[2] or attn.shape[1] == 0:
        raise InvalidArgument("attn", f"expected a causal map [heads, n, n] with n >= 1, got shape {tuple(attn.shape)}")
    return attn


def pooled_attention(attn: torch.Tensor, grid: int | tuple[int, int]) -> torch.Tensor:
    """Mean-pool a whole causal map ``attn [heads, n, n]`` into ``[heads, Gq, Gk]`` float32 (module docstring)."""
    attn = _check_square(attn)
    shape = grid_shape(grid)
    n = attn.shape[1]
    widths = (bin_width(n, shape[0]), bin_width(n, shape[1]))
    sums = _row_block_sums(attn, torch.arange(n), shape, widths)
    return _cell_means(sums, _bin_sizes(n, shape[0], widths[0]), n, widths[1])


def edge_mass(attn: torch.Tensor) -> float:
    """Initial plus recent window mass of a whole causal map ``attn [heads, n, n]``, mean over heads and rows."""
    attn = _check_square(attn)
    return _edge_sum(attn, torch.arange(attn.shape[1])) / (attn.shape[0] * attn.shape[1])


@dataclass(frozen=True)
class AttentionStats:
    """What the strategy selector reads of a conversation: one pooled map and one edge mass per layer."""

    maps: torch.Tensor  # [layers, heads, Gq, Gk] float32, pooled_attention of each layer
    edge_mass: torch.Tensor  # [layers] float32 in [0, 2]

    def __post_init__(self):
        maps = check_tensor("stats.maps", self.maps, 4)
        edge = check_tensor("stats.edge_mass", self.edge_mass, 1)
        if maps.shape[0] == 0 or 0 in maps.shape:
            raise InvalidArgument("stats.maps", f"expected [layers, heads, rows, cols] with every size >= 1, got {tuple(maps.shape)}")
        if edge.shape[0] != maps.shape[0]:
            raise InvalidArgument("stats.edge_mass", f"has {edge.shape[0]} layers, the maps {maps.shape[0]}")

    @property
    def num_layers(self) -> int:
        return int(self.maps.shape[0])


class AttentionSketch:
    """Folds a conversation's attention into ``AttentionStats``, prefill blocks and decode rows alike.

    Rows of each layer's map arrive in order: a block ``[heads, q, k]`` is
    the map's rows ``k-q .. k-1`` (the first turn's prefill is the square
    ``q = k``; a later turn's prefill is its ``q`` new rows over all ``k``
    keys; a decode step is one row).  Layers are independent: each may be
    fed whenever its attention is at hand.  Memory: see the module docstring.

    ``add_rows`` folds in a sample of a block's rows instead (e.g. every
    4th): each cell is then the mean over the rows folded into its row bin,
    and the edge mass the mean over the rows folded - estimates of the whole
    map's, unbiased for a sample spread evenly over each bin.  A row bin
    that no folded row falls in reads 0, so a sample should be denser than
    the final bin width (``n / Gq`` rounded up to a power of two).
    """

    def __init__(self, num_layers: int, num_heads: int, grid: int | tuple[int, int] = 32):
        self.num_layers = check_int("num_layers", num_layers, 1)
        self.num_heads = check_int("num_heads", num_heads, 1)
        self.grid = grid_shape(grid)
        self._sums = torch.zeros(self.num_layers, self.num_heads, *self.grid, dtype=torch.float64)  # [L, heads, Gq, Gk]
        self._widths = [(1, 1)] * self.num_layers
        self._rows = [0] * self.num_layers  # positions covered
        self._counts = torch.zeros(self.num_layers, self.grid[0], dtype=torch.float64)  # rows folded per row bin
        self._edge = [0.0] * self.num_layers

    def num_rows(self, layer: int) -> int:
        """Rows (= positions) of ``layer``'s map covered so far (folded in, or skipped by a sample)."""
        return self._rows[self._check_layer(layer)]

    def num_folded(self, layer: int) -> int:
        """Rows of ``layer``'s map folded in (``num_rows`` unless ``add_rows`` sampled them)."""
        return int(self._counts[self._check_layer(layer)].sum())

    def add_prefill(self, layer: int, attn: torch.Tensor) -> None:
        """Fold in the rows ``k-q .. k-1`` of ``layer``'s map: ``attn [heads, q, k]``, ``k`` = rows so far + ``q``."""
        layer = self._check_layer(layer)
        attn = check_tensor("attn", attn, 3, finite=False)  # a NaN or inf reaches the block's sums: checked there, 20x cheaper
        heads, q, k = attn.shape
        if heads != self.num_heads or q == 0 or k != self._rows[layer] + q:
            raise InvalidArgument(
                "attn",
                f"expected [{self.num_heads}, q, {self._rows[layer]} + q] with q >= 1 (layer {layer} has "
                f"{self._rows[layer]} rows), got shape {tuple(attn.shape)}",
            )
        self._fold(layer, attn, torch.arange(k - q, k))

    def add_rows(self, layer: int, attn: torch.Tensor, rows: torch.Tensor) -> None:
        """Cover the map up to ``k`` rows, folding in a sample: ``attn [heads, q, k]`` are the rows at positions ``rows [q]``.

        ``rows``: increasing, from the rows covered so far up to ``k - 1``
        (``q = 0`` only advances); entries of a row past its position must
        be 0 (causal).  The class docstring says what the sample estimates.
        """
        layer = self._check_layer(layer)
        attn = check_tensor("attn", attn, 3, finite=False)
        rows = torch.as_tensor(rows).reshape(-1)
        heads, q, k = attn.shape
        first = self._rows[layer]
        if heads != self.num_heads or k <= first or rows.numel() != q:
            raise InvalidArgument(
                "attn",
                f"expected [{self.num_heads}, {rows.numel()}, k > {first}] (layer {layer} covers {first} rows), got {tuple(attn.shape)}",
            )
        if q and (rows.dtype.is_floating_point or int(rows[0]) < first or int(rows[-1]) >= k or bool((rows[1:] <= rows[:-1]).any())):
            raise InvalidArgument("rows", f"must be increasing integers in [{first}, {k}), got {rows.tolist()[:4]}...")
        self._fold(layer, attn, rows.long())

    def _fold(self, layer: int, attn: torch.Tensor, rows: torch.Tensor) -> None:
        k = attn.shape[2]
        widths = (bin_width(k, self.grid[0]), bin_width(k, self.grid[1]))
        sums = _row_block_sums(attn, rows, self.grid, widths)
        edge = _edge_sum(attn, rows)
        if not (math.isfinite(edge) and torch.isfinite(sums).all()):
            raise InvalidArgument("attn", "contains NaN or infinity")
        self._grow(layer, k)
        self._sums[layer] += sums
        self._counts[layer].index_add_(0, rows // widths[0], torch.ones(rows.numel(), dtype=torch.float64))
        self._edge[layer] += edge
        self._rows[layer] = k

    def add_decode(self, layer: int, attn_row: torch.Tensor) -> None:
        """Fold in one decode step's row ``attn_row [heads, k]`` (``k`` = rows so far + 1)."""
        attn_row = check_tensor("attn_row", attn_row, 2)
        self.add_prefill(layer, attn_row.unsqueeze(1))

    def pooled(self, layer: int) -> torch.Tensor:
        """``layer``'s pooled map ``[heads, Gq, Gk]`` float32: ``pooled_attention`` of its whole map."""
        layer = self._check_layer(layer)
        return _cell_means(self._sums[layer], self._counts[layer], self._rows[layer], self._widths[layer][1])

    def edge_mass(self, layer: int) -> float:
        """``layer``'s edge mass: ``edge_mass`` of its whole map (0 before any row folded)."""
        folded = self.num_folded(layer)
        return self._edge[layer] / (self.num_heads * folded) if folded else 0.0

    def stats(self) -> AttentionStats:
        """Every layer's statistics; all layers must hold the same, non-zero number of rows."""
        if len(set(self._rows)) != 1 or self._rows[0] == 0:
            raise InvalidArgument("sketch", f"layers hold different or no rows: {sorted(set(self._rows))}")
        maps = torch.stack([self.pooled(layer) for layer in range(self.num_layers)])
        edge = torch.tensor([self.edge_mass(layer) for layer in range(self.num_layers)], dtype=torch.float32)
        return AttentionStats(maps, edge)

    @property
    def nbytes(self) -> int:
        """Bytes of the state: the float64 sums and row counts plus four numbers per layer."""
        return (self._sums.numel() + self._counts.numel()) * 8 + 4 * 8 * self.num_layers

    def _check_layer(self, layer: int) -> int:
        return check_int("layer", layer, 0, self.num_layers - 1)

    def _grow(self, layer: int, num_positions: int) -> None:
        """Double the bin widths until the grid covers ``num_positions``, merging the sums' bins to match."""
        sums = self._sums[layer]
        widths = list(self._widths[layer])
        for axis in (0, 1):
            target = bin_width(num_positions, self.grid[axis])
            factor = target // widths[axis]  # both powers of two, target >= the width
            if factor > 1:
                sums = _merge_bins(sums, axis + 1, factor)
                widths[axis] = target
                if axis == 0:
                    self._counts[layer] = _merge_bins(self._counts[layer], 0, factor)
        self._sums[layer] = sums
        self._widths[layer] = (widths[0], widths[1])


def _merge_bins(sums: torch.Tensor, dim: int, factor: int) -> torch.Tensor:
    """Sum every ``factor`` consecutive bins of ``sums`` along ``dim`` into one, zero-padding back to the grid size."""
    size = sums.shape[dim]
    moved = sums.movedim(dim, -1)  # [..., size]
    padded = torch.nn.functional.pad(moved, (0, math.ceil(size / factor) * factor - size))
    merged = padded.reshape(*moved.shape[:-1], -1, factor).sum(-1)  # [..., ceil(size / factor)]
    return torch.nn.functional.pad(merged, (0, size - merged.shape[-1])).movedim(-1, dim)
