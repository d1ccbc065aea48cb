"""A decoder layer's parts before and after attention, captured as CUDA graphs and replayed.

A Re-Prefill step runs a few dozen suffix tokens through a layer: on a GPU
its time is the launch of some forty small kernels, not their work (an
H200 took 0.75-0.89 ms for a layer whose kernels need 0.03-0.15 ms).  The
parts of a layer that depend on the suffix alone (the input norm, the qkv
projection, RoPE; the output projection, the MLP and both residual adds)
have the same shapes for every request with the same number of suffix
tokens, so each is captured once per layer and suffix length and replayed
as one launch.  Attention stays eager: its shape is the number of loaded
rows, which changes with every Period and request.

Per layer call: one copy of the input into the graph's buffer, the "pre"
replay, the stack and concatenation of the KV, the attention kernel, one
copy of its output, the "post" replay and one copy of the result out (the
graph's output buffer is overwritten by its next replay).  The request's
RoPE rows are copied into the graphs' buffers once per ``Positions``.

Graphs are kept for up to ``MAX_SETS`` suffix lengths (least recently used
goes first) of at most ``MAX_TOKENS`` tokens; longer inputs (prefill blocks)
run eagerly, where launches are a small share of the work.  Each thread has
sets of its own: the buffers hold one request's layer between its two
replays.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

MAX_TOKENS = 256  # suffix lengths captured; a longer input's kernels outweigh their launches
MAX_SETS = 4  # suffix lengths kept at once


class LayerGraphs:
    """The decoder's graph sets, one per suffix length (``for_tokens``)."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.sets: OrderedDict[tuple[int, int], _GraphSet] = OrderedDict()  # (thread, suffix tokens) -> set
        self.captures = 0  # graphs captured so far (two per layer and suffix length)
        self._lock = threading.Lock()

    def for_tokens(self, s: int) -> _GraphSet | None:
        if s > MAX_TOKENS:
            return None
        key = (threading.get_ident(), s)
        with self._lock:
            found = self.sets.get(key)
            if found is None:
                found = self.sets[key] = _GraphSet(self, s)
                while len(self.sets) > MAX_SETS:
                    self.sets.popitem(last=False)
            self.sets.move_to_end(key)
        return found


class _GraphSet:
    """The graphs of every layer for ``s`` suffix tokens, captured on first use, with their input buffers."""

    def __init__(self, owner: LayerGraphs, s: int):
        dec = owner.decoder
        c = dec.config
        self.owner, self.decoder, self.s = owner, dec, s
        self.hidden = torch.zeros(s, c.hidden_size, dtype=dec.dtype, device=dec.device)
        self.attn = torch.zeros(c.num_attention_heads, s, c.head_dim, dtype=dec.dtype, device=dec.device)
        self.rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per RoPE table: cos, sin [s, d] buffers
        self.rope_of: dict[int, object] = {}  # per RoPE table: the Positions its buffers hold
        self.pre_graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.post_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def pre(self, layer: int, hidden: torch.Tensor, positions, cos: torch.Tensor, sin: torch.Tensor):
        """``q, k, v`` of ``layer`` for ``hidden`` (graph buffers: read them before this layer's next replay)."""
        table = id(self.decoder._ropes[layer])
        if table not in self.rope:
            self.rope[table] = (torch.zeros_like(cos), torch.zeros_like(sin))
        if self.rope_of.get(table) is not positions:  # a new request: its RoPE rows, once for every layer
            self.rope[table][0].copy_(cos)
            self.rope[table][1].copy_(sin)
            self.rope_of[table] = positions
        self.hidden.copy_(hidden)
        if layer not in self.pre_graphs:
            cos_b, sin_b = self.rope[table]
            self.pre_graphs[layer] = self._capture(lambda: self.decoder._pre_attention(layer, self.hidden, cos_b, sin_b))
        graph, out = self.pre_graphs[layer]
        graph.replay()
        return out

    def post(self, layer: int, attn: torch.Tensor) -> torch.Tensor:
        """The layer's output for the input ``pre`` was given and ``attn [Hq, s, d]`` (a tensor of its own)."""
        self.attn.copy_(attn)
        if layer not in self.post_graphs:
            self.post_graphs[layer] = self._capture(lambda: self.decoder._post_attention(layer, self.hidden, self.attn))
        graph, out = self.post_graphs[layer]
        graph.replay()
        return out.clone()

    def _capture(self, fn):
        """``fn`` run twice on a side stream (lazy initialisations happen outside the capture), then captured."""
        device = self.decoder.device
        main = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            fn()
            fn()
        main.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        self.owner.captures += 1
        return graph, out
