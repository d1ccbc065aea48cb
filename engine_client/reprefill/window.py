"""The window-tail layout of a model with sliding-window layers (Gemma 3): what the store keeps of each layer.

A sliding layer's query at position ``p`` sees positions ``(p - W, p]`` only,
so after a prefix of ``n`` tokens no suffix or decoded token ever reads its
rows before ``n - W``.  Storing them, as the whole layout does, is waste: at
Gemma 3 270M's 15 sliding layers of 18 and a 512-token window, 62% of a
2048-token prefix's KV and 82% of a 32k one's (``kvstore_tools.window_bytes``).

In the window-tail layout

* the prefix's **extents hold its global layers only**: the store geometry's
  layers are the model's global layers, in order (``StoredLayers``), so the
  daemon's chunks, key summaries and probe keys are theirs alone, and a
  chunk shared by a longer prefix is shared as before;
* each **sliding layer's last window** is kept per prefix as pages
  (``stream_tail``'s tail with no sink and ``recent_tokens = W``, one
  single-head "layer" per (sliding layer, KV head) pair), under keys drawn
  from the prefix id.  Which rows are a prefix's last depends on where it
  ends, so a longer prefix sharing its chunks has its own tail; a request
  finding no tail is told so and ``ModelRunner.store_prefix`` puts it again.

A Re-Prefill fetches the tail once per prefix and keeps it (the runner's
resident state); a sliding Period then computes on those rows with their
positions and sends the daemon nothing, and only the global layers' Periods
go through the selection and the Prefetch stream, whose Periods are the
stored layers'.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.contract import InvalidArgument


@dataclass(frozen=True)
class StoredLayers:
    """Which model layers a runner's stored groups hold, in order: every layer (``tail`` None), or with a
    window tail the global layers, the sliding ones kept in ``tail`` (``WindowTail``)."""

    layers: tuple[int, ...]
    tail: WindowTail | None = None

    @classmethod
    def every(cls, num_layers: int) -> StoredLayers:
        return cls(tuple(range(num_layers)))

    def stored(self, layer: int) -> int:
        """The stored layer (the index in the store geometry) of model layer ``layer``; ValueError for a layer
        kept in the window tail."""
        if self.tail is None:
            return layer
        try:
            return self.layers.index(layer)
        except ValueError:
            raise ValueError(f"layer {layer} slides: its rows are the prefix's window tail, not stored extents") from None

    def model_layers(self, geometry, group: int) -> list[int]:
        """The model layers of stored group ``group`` of ``geometry``."""
        return [self.layers[i] for i in geometry.group_layer_range(group)]

    def is_stored(self, layer: int) -> bool:
        return self.tail is None or layer in self.layers


@dataclass(frozen=True)
class WindowTail:
    """The sliding layers' last ``recent_tokens`` rows of a prefix, as ``stream_tail`` pages of ``pairs``."""

    pairs: tuple[tuple[int, int], ...]  # (sliding layer, KV head), in layer order
    recent_tokens: int  # the window, W
    sink_tokens: int = 0

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.pairs}))


def stored_layers(config, *, window_tail: bool, group_layers: int) -> StoredLayers:
    """The layers a runner of a model with ``config`` stores (module docstring); InvalidArgument, naming the
    flag, where the window tail cannot be used."""
    if not window_tail:
        return StoredLayers.every(config.num_hidden_layers)
    sliding = set(config.sliding_layers)
    if not sliding:
        raise InvalidArgument("window_tail", "the model has no sliding-window layers: every layer is stored whole")
    if len(sliding) == config.num_hidden_layers:
        raise InvalidArgument("window_tail", "every layer of the model slides: there is no global layer to store as extents")
    if group_layers != 1:
        raise InvalidArgument("group_layers", f"the window-tail layout stores 1-layer groups (its Periods are 1 layer), got {group_layers}")
    pairs = tuple((layer, h) for layer in sorted(sliding) for h in range(config.num_key_value_heads))
    tail = WindowTail(pairs, recent_tokens=int(config.sliding_window))
    return StoredLayers(tuple(x for x in range(config.num_hidden_layers) if x not in sliding), tail)
