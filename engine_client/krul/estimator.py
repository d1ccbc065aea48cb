"""Krul's similarity estimator: a conversation's ``AttentionSketch`` fed from the model's own passes, off the critical path.

The paths that run a conversation's model (``prefill.prefill_with_attention``,
``generation.dense_generate`` and ``decode_greedy``) take an ``observe``
callback; ``AttentionEstimator.observe`` is one.  The model calls it after
each layer with what the layer saw: its input ``hidden [s, hidden]`` at
``positions [s]`` (the next ``s`` rows of the layer's attention map) and
the post-RoPE keys ``[Hkv, k, d]`` they attended to.  ``observe`` only
queues references (the hidden input is a tensor the model no longer
changes; the keys a view of rows it only appends after), so the forward
pass waits for nothing; a background thread recomputes the rows' queries
(``Decoder.layer_queries``), their causal softmax over the keys in blocks
of ``block_rows`` rows (never an ``n x n`` map), and folds them into the
sketch.  A prefill block goes to the thread at once; decode steps (one
row each) are gathered per layer and go every ``decode_batch`` steps, so
the thread's per-call cost is paid once per batch, not per token.  With
``defer=True`` the thread starts only in ``stats()``: generation pays
nothing but the queued inputs' memory (every layer's hidden input, e.g.
141 MiB for 2048 tokens of SmolLM2), and ``stats()`` pays all the compute
- for a machine whose cores the model keeps busy.  Otherwise the
thread runs ``nice`` steps below the model (Linux, per thread; its torch
worker threads inherit it): where the cores are busy with the model's
prefill, the estimator mostly yields them and catches up while decoding
or in ``stats()``.  The model never waits for the thread; it is slowed
only by sharing the cores, which ``kvstore-bench estimator`` measures.

``stats()`` sends what is gathered, waits for the thread to finish and
returns the sketch's ``AttentionStats`` - the same, up to float rounding,
as feeding the whole maps at once (``tests/unit/test_krul_estimator.py``).
With ``row_stride=s`` only the rows at positions ``s-1, 2s-1, ...`` are
computed (``AttentionSketch.add_rows``): about ``s`` times less work, and
statistics that estimate the whole map's (``kvstore-bench estimator``
measures how often they choose the same strategy).
``busy_s`` (the thread's compute time), ``queued_peak_bytes`` (hidden
inputs waiting at most at once) and ``sketch.nbytes`` are its cost;
``kvstore-bench estimator`` measures it on generation.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time

import torch

from kvstore.contract import InvalidArgument

from ._checks import check_int
from .sketch import AttentionSketch, AttentionStats


class AttentionEstimator:
    """An ``AttentionSketch`` of one conversation, fed by ``observe`` and computed in a background thread."""

    def __init__(
        self,
        model,
        *,
        grid: int = 32,
        decode_batch: int = 16,
        block_rows: int = 256,
        nice: int = 10,
        defer: bool = False,
        row_stride: int = 1,
    ):
        config = model.config
        self.model = model
        self.sketch = AttentionSketch(config.num_hidden_layers, config.num_attention_heads, grid=grid)
        self.decode_batch = check_int("decode_batch", decode_batch, 1)
        self.block_rows = check_int("block_rows", block_rows, 1)
        self.nice = check_int("nice", nice, 0, 19)
        self.row_stride = check_int("row_stride", row_stride, 1)
        self.niced = False  # whether the thread runs at the lower priority (Linux)
        if not isinstance(defer, bool):
            raise InvalidArgument("defer", f"must be a bool, got {defer!r}")
        self._start = threading.Event()  # the thread waits for it before its first job
        if not defer:
            self._start.set()
        self._group = config.num_attention_heads // config.num_key_value_heads
        self._scale = 1.0 / math.sqrt(config.head_dim)
        self._rows = [0] * config.num_hidden_layers  # rows observed per layer (sent or gathered)
        self._gathered: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(config.num_hidden_layers)]
        self._keys: list[torch.Tensor | None] = [None] * config.num_hidden_layers  # the latest keys seen per layer
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._queued_bytes = 0
        self.queued_peak_bytes = 0
        self.busy_s = 0.0
        self.jobs_done = 0
        self._thread = threading.Thread(target=self._work, name="krul-estimator", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the model's side
    def observe(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor) -> None:
        """``layer`` ran on ``hidden [s, hidden]`` at ``positions [s]`` over ``keys [Hkv, k, d]`` (``k`` = last position + 1)."""
        self._raise_error()
        layer = check_int("layer", layer, 0, self.sketch.num_layers - 1)
        s = hidden.shape[0]
        first = self._rows[layer]
        if positions.numel() != s or s == 0 or int(positions[0]) != first or int(positions[-1]) != first + s - 1:
            raise InvalidArgument("positions", f"layer {layer} expects {s} positions from {first} on, got {positions.tolist()[:4]}...")
        if keys.dim() != 3 or keys.shape[1] < first + s:
            raise InvalidArgument("keys", f"layer {layer} needs at least {first + s} keys, got shape {tuple(keys.shape)}")
        self._rows[layer] = first + s
        self._keys[layer] = keys
        self._gathered[layer].append((hidden, positions))
        if s > 1 or len(self._gathered[layer]) >= self.decode_batch:
            self._send(layer)

    def stats(self) -> AttentionStats:
        """Every row observed folded in (waits for the thread); the sketch's statistics."""
        self._raise_error()
        for layer in range(self.sketch.num_layers):
            self._send(layer)
        self._start.set()
        self._jobs.join()
        self._raise_error()
        return self.sketch.stats()

    def close(self) -> None:
        """Stop the thread (what is queued is dropped)."""
        self._error = self._error or _Closed()
        self._start.set()
        self._jobs.put(None)
        self._thread.join()

    def __enter__(self) -> AttentionEstimator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def nbytes(self) -> int:
        """The sketch's state (the queued inputs are counted in ``queued_peak_bytes``)."""
        return self.sketch.nbytes

    # ------------------------------------------------------------ the thread's side
    def _send(self, layer: int) -> None:
        gathered = self._gathered[layer]
        if not gathered:
            return
        hidden = gathered[0][0] if len(gathered) == 1 else torch.cat([h for h, _ in gathered])
        positions = gathered[0][1] if len(gathered) == 1 else torch.cat([p for _, p in gathered])
        self._gathered[layer] = []
        nbytes = hidden.numel() * hidden.element_size()
        with self._lock:
            self._queued_bytes += nbytes
            self.queued_peak_bytes = max(self.queued_peak_bytes, self._queued_bytes)
        self._jobs.put((layer, hidden, positions, self._keys[layer], nbytes))

    def _lower_priority(self) -> None:
        """Run this thread (and the torch worker threads it starts) ``nice`` steps below the model's."""
        if not self.nice or not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
            return
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + self.nice))
            self.niced = True
        except OSError:  # a platform where the id names the process, or a sandbox that refuses: run at the same priority
            pass

    def _work(self) -> None:
        self._lower_priority()
        self._start.wait()
        while True:
            job = self._jobs.get()
            if job is None:
                self._jobs.task_done()
                return
            layer, hidden, positions, keys, nbytes = job
            try:
                if self._error is None:
                    t0 = time.perf_counter()
                    self._fold(layer, hidden, positions, keys)
                    self.busy_s += time.perf_counter() - t0
                    self.jobs_done += 1
            except BaseException as exc:  # reported by the next observe or stats
                self._error = exc
            finally:
                with self._lock:
                    self._queued_bytes -= nbytes
                self._jobs.task_done()

    @torch.inference_mode()
    def _fold(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor) -> None:
        """The causal attention rows of ``positions`` (every ``row_stride``-th) over ``keys``, block by block, into the sketch."""
        covered = int(positions[-1]) + 1  # the job's rows, folded or skipped
        if self.row_stride > 1:
            keep = positions % self.row_stride == self.row_stride - 1
            hidden, positions = hidden[keep], positions[keep]
        s = positions.numel()
        if s:
            q = self.model.layer_queries(layer, hidden, positions).float()  # [Hq, s, d]
            keys = keys[:, :covered].float()  # [Hkv, k, d]
        for start in range(0, s, self.block_rows):
            stop = min(start + self.block_rows, s)
            rows = positions[start:stop]
            k = int(rows[-1]) + 1  # the block's last row sees every key before it
            hkv, hq, d = keys.shape[0], q.shape[0], q.shape[2]
            qb = q[:, start:stop].reshape(hkv, self._group * (stop - start), d)  # [Hkv, g*b, d]
            logits = torch.matmul(qb, keys[:, :k].transpose(1, 2)).mul_(self._scale)  # [Hkv, g*b, k]
            logits = logits.view(hq, stop - start, k)  # query head h reads KV head h // g
            first = int(rows[0])  # keys before it are visible to every row of the block
            logits[..., first:].masked_fill_(torch.arange(first, k)[None, :] > rows[:, None], float("-inf"))
            self.sketch.add_rows(layer, torch.softmax(logits, dim=-1), rows)
        if self.sketch.num_rows(layer) < covered:  # the job's last rows were not sampled
            self.sketch.add_rows(layer, torch.zeros(self.sketch.num_heads, 0, covered), torch.zeros(0, dtype=torch.long))

    def _raise_error(self) -> None:
        if isinstance(self._error, _Closed):
            raise InvalidArgument("estimator", "is closed")
        if self._error is not None:
            raise RuntimeError(f"the attention estimator failed: {self._error!r}") from self._error


class _Closed(Exception):
    """The estimator was closed: the thread drops the jobs still queued."""
