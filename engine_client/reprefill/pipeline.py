"""One Re-Prefill request as a pipeline: plan, then per Period select -> send -> compute, then report.

``Request`` owns everything one request touches (its plan, hidden state,
selection and result); ``run`` is the loop over it.  Per Period: the first
layer's queries choose the chunks (``select.PeriodSelection``), the set goes
to the daemon on the Prefetch stream (the one host round trip a Period makes),
a look-ahead guess for the next Period is hinted while the daemon reads, and
the Period's layers are computed as its groups arrive (``period.run_period``).
After the last Period the first token's logits are taken; then each selected
chunk's attention mass is measured and reported.  A Period of sliding-window
layers (``PeriodPlan.windowed``) is neither selected, measured nor reported:
in the window-tail layout (``window``) it computes on the prefix's tail rows,
kept by the runner, and sends nothing (the stream's Periods are the stored
layers'); with every layer stored whole it sends its window's last chunks.
Either way its layers get the rows' positions.
"""

from __future__ import annotations

import time

import torch

from ..selection import Budget
from .device import to_host, wait
from .period import PeriodRows, chunk_mass, layer_mask, row_positions, run_period
from .result import ReprefillResult
from .select import PeriodSelection


def run(req: Request) -> ReprefillResult:
    """The request loop (module docstring)."""
    model, cfg = req.model, req.cfg
    period = cfg.schedule.period_layers
    with req.open_stream() as stream:
        for p, (l0, layers, count) in enumerate(req.plan.periods):
            if req.window is not None and l0 in req.plan.windowed:  # the window tail's rows, kept: nothing to send
                req.window_period(p, l0, layers)
                continue
            t0 = time.perf_counter()
            q = model.layer_queries(l0, req.hidden, req.positions)  # [Hq, s, d]
            chunks, head_sets = req.choose(p, l0, q, count)
            req.took(p, t0, chunks, head_sets)
            sp = req.stream_period(p, l0)
            stream.send(sp, req.out.selected[p].numpy())
            nxt = req.next_sent(l0)
            if req.hints and nxt is not None:  # a guess for the stream's next Period while the daemon loads this one
                t0 = time.perf_counter()
                req.out.hints[nxt // period] = torch.from_numpy(to_host(req.guess(nxt)))
                stream.hint(sp + 1, req.out.hints[nxt // period].numpy())
                req.timed(p, t0)
            rows = req.period_rows(p, l0)
            groups = stream.groups(sp) if cfg.fetch.overlap else list(stream.groups(sp))  # off: the whole Period first
            req.hidden, first_keys = run_period(
                model,
                req.geometry,
                groups,
                l0,
                req.hidden,
                req.positions,
                rows,
                req.out,
                prefill_alpha=cfg.attention.prefill_alpha,
                staging=req.runner.staging,
                layers_of=req.layers_of,
            )
            req.loaded(p, l0, layers, stream.chunk_tokens(sp).tolist(), q, first_keys)
        t0 = time.perf_counter()
        req.out.logits = wait(model.final_logits(req.hidden))
        req.out.compute_s += time.perf_counter() - t0
        req.out.ttft_s = time.perf_counter() - req.t_start
    req.settle(stream)
    return req.out


def warm(runner, desc, cfg, plan, layers) -> int:
    """What ``Request`` and its Periods fetch into the runner's resident state for ``desc``'s prefix under
    ``cfg`` (``ModelRunner.warm``), fetched now; the bytes fetched."""
    out = ReprefillResult(logits=torch.empty(0), ttft_s=0.0, selected=[], num_prefix_tokens=desc.num_tokens, prefix_id=desc.prefix_id)
    state, stored, pid = runner.state, runner.layers.stored, desc.prefix_id
    state.prefix(pid).stored_probe_bits = desc.geometry.probe_bits
    selection = PeriodSelection(
        cfg, state, pid, desc.num_chunks, runner.streaming_heads, out, layers=runner.layers, follow_top=runner.follow_top(cfg)
    )
    for layer in layers.standins:
        state.value_sum(pid, stored(layer), desc.num_chunks, out)
    if runner.geometry.streaming_heads or (runner.window is not None and plan.windowed):
        runner.tail(pid, desc.num_tokens, out)
    for l0, _, count in plan.periods:
        if l0 in layers.standins:
            state.probe(pid, stored(l0) // runner.geometry.group_layers, cfg.selection.probe_bits, out)
        if l0 not in plan.windowed:
            selection.warm(l0, Budget.chunks(count))
    return out.state_bytes_fetched + out.probe_bytes


class Request:
    """One Re-Prefill's state: the runner's parts it uses, its plan and its result (``runner.ModelRunner.reprefill``)."""

    def __init__(
        self, runner, desc, suffix: torch.Tensor, cfg, budget: Budget, plan, layers, *, choose=None, keep_kv: bool = False, t_start=None
    ):
        self.t_start = time.perf_counter() if t_start is None else t_start  # the TTFT clock (``ModelRunner.reprefill``: its call)
        self.runner, self.model, self.geometry, self.cfg, self.plan = runner, runner.model, runner.geometry, cfg, plan
        self.prefix_id, self.n, self.m, self.choose_fn = desc.prefix_id, desc.num_tokens, desc.num_chunks, choose
        model, dev = runner.model, runner.device
        self.positions = model.position_range(self.n, suffix.numel())  # on the device, bounds on the host: no sync per layer
        self.hidden = model.embed(suffix.to(dev))  # [s, hidden]
        out = self.out = ReprefillResult(logits=torch.empty(0), ttft_s=0.0, selected=[], num_prefix_tokens=self.n, prefix_id=self.prefix_id)
        out.standin_layers = layers.standins
        if keep_kv:
            out.layer_kv = [None] * model.num_layers
        if cfg.attention.streaming or cfg.selection.per_head:
            out.row_masks = [None] * model.num_layers
        self.selection = PeriodSelection(
            cfg, runner.state, self.prefix_id, self.m, runner.streaming_heads, out, layers=runner.layers, follow_top=runner.follow_top(cfg)
        )
        self.hints = bool(
            cfg.fetch.speculate and cfg.fetch.lookahead and choose is None and not self.selection.selector.loads_all and not budget.is_all
        )
        out.hints = [None] * len(plan.periods)
        out.period_select_s = [0.0] * len(plan.periods)
        out.layer_compute_s = [0.0] * model.num_layers
        stored = runner.layers.stored
        self.standins = {layer: runner.state.value_sum(self.prefix_id, stored(layer), self.m, out) for layer in layers.standins}
        self.tail = runner.tail(self.prefix_id, self.n, out) if self.geometry.streaming_heads else None
        self.window = runner.window  # the window-tail layout's sliding layers (``window``), or None
        self.window_rows = self._window_rows(out) if self.window is not None and plan.windowed else None
        self.mass_inputs: list = []

    def _window_rows(self, out):
        """The window tail's rows as each sliding layer sees them: (positions on the host, on the device,
        ``{layer: [2, Hkv, t, d]}`` on the device), from the runner's kept tail."""
        positions, rows = self.runner.tail(self.prefix_id, self.n, out)
        index, hkv = self.runner.tail_pairs, self.model.config.num_key_value_heads
        by_layer = {
            layer: torch.stack([rows[index[(layer, h)]] for h in range(hkv)], dim=1) for layer in self.window.sliding_layers
        }  # each [2, Hkv, t, d]
        return positions, positions.to(self.runner.device), by_layer

    def stream_period(self, p: int, l0: int) -> int:
        """The Prefetch stream's Period of plan Period ``p`` (first layer ``l0``): the same, or in the
        window-tail layout the stored layers' Period."""
        return p if self.window is None else self.runner.layers.stored(l0) // self.cfg.schedule.period_layers

    def next_sent(self, l0: int) -> int | None:
        """First layer of the next Period that goes through the stream after the one at ``l0``; None: none."""
        period = self.cfg.schedule.period_layers
        for first in range(l0 + period, self.model.num_layers, period):
            if self.window is None or first not in self.plan.windowed:
                return first
        return None

    def layers_of(self, group: int) -> list[int]:
        """The model layers of a stored group."""
        return self.runner.layers.model_layers(self.geometry, group)

    def window_period(self, p: int, l0: int, layers: int) -> None:
        """Period ``p`` of sliding layers in the window-tail layout: its layers over the tail's rows."""
        t0 = time.perf_counter()
        positions, positions_dev, by_layer = self.window_rows
        ct = self.geometry.chunk_tokens
        self.took(p, t0, torch.unique(positions // ct), [])  # the chunks the rows come from
        rows = PeriodRows(positions=positions, positions_dev=positions_dev, windowed=True)
        span = list(range(l0, min(l0 + layers, self.model.num_layers)))
        kv = torch.stack([by_layer[layer] for layer in span])  # [layers, 2, Hkv, t, d] on the device
        self.hidden, first_keys = run_period(
            self.model,
            self.geometry,
            [(None, kv)],
            l0,
            self.hidden,
            self.positions,
            rows,
            self.out,
            prefill_alpha=self.cfg.attention.prefill_alpha,
            layers_of=lambda _: span,
        )
        self.loaded(p, l0, layers, [int(positions.numel())], None, first_keys)

    def open_stream(self):
        f = self.cfg.fetch
        push = None if f.push else False  # None: pushed whenever speculating over shared memory
        stream = self.runner.client.prefetch(  # the header's round trip overlaps the first Period's selection
            self.prefix_id,
            period_layers=self.cfg.schedule.period_layers,
            speculate=f.speculate,
            hints=self.hints,
            push=push,
            wait_header=False,
        )
        staging = self.runner.staging
        if staging is not None and hasattr(stream, "group_out"):  # rows gathered straight into pinned buffers
            staging.reset()
            stream.group_out = staging.host
            stream.group_out_chunks = staging.host_chunks  # extents copied as stored, put in order on the device
        return stream

    def choose(self, p: int, l0: int, q: torch.Tensor, count: int):
        """Period ``p``'s chunk ids (and per-KV-head sets): the caller's ``choose``, every chunk, or the selection."""
        head_sets: list[torch.Tensor] = []
        if l0 in self.plan.windowed:  # sliding layers: the chunks their window still sees
            return torch.arange(self.m - count, self.m), head_sets
        if self.choose_fn is not None:
            return torch.as_tensor(self.choose_fn(p, l0, q, self.m), dtype=torch.long), head_sets
        if count == self.m:  # a Period loaded in full
            return torch.arange(self.m), head_sets
        q = q[:, -self.cfg.selection.select_queries :] if self.cfg.selection.select_queries else q
        return self.selection.choose(q, l0, Budget.chunks(count), head_sets), head_sets

    def guess(self, l0: int) -> torch.Tensor:
        """The look-ahead hint for the Period at ``l0``: its own queries on the hidden state at hand
        (a sliding Period's: its window)."""
        if l0 in self.plan.windowed:
            count = self.plan.periods[l0 // self.cfg.schedule.period_layers][2]
            return torch.arange(self.m - count, self.m)
        q = self.model.layer_queries(l0, self.hidden, self.positions)
        q = q[:, -self.cfg.selection.select_queries :] if self.cfg.selection.select_queries else q
        return self.selection.choose(q, l0, self.cfg.budget.scaled(self.cfg.fetch.lookahead))

    def took(self, p: int, t0: float, chunks: torch.Tensor, head_sets: list) -> None:
        """Record Period ``p``'s set on the host (what the daemon is sent) and the time it took."""
        self.out.selected.append(torch.from_numpy(to_host(chunks)))
        self.out.head_sets.append([torch.from_numpy(to_host(h)) for h in head_sets])
        self.timed(p, t0)

    def timed(self, p: int, t0: float) -> None:
        self.out.period_select_s[p] += time.perf_counter() - t0
        self.out.select_s += time.perf_counter() - t0

    def period_rows(self, p: int, l0: int) -> PeriodRows:
        """How Period ``p``'s layers see the prefix rows (``period.PeriodRows``), decided from its set on the host."""
        cfg, dev, ct = self.cfg, self.runner.device, self.geometry.chunk_tokens
        chunks, head_sets = self.out.selected[p], self.out.head_sets[p]
        rows = PeriodRows()
        if cfg.attention.prefill_alpha or l0 in self.standins or self.tail is not None or l0 in self.plan.windowed:
            rows.positions = row_positions(chunks, self.n, ct)
            rows.positions_dev = rows.positions.to(dev)
        rows.windowed = l0 in self.plan.windowed
        if cfg.attention.streaming or head_sets:
            pos = row_positions(chunks, self.n, ct)
            heads = self.runner.streaming_heads if cfg.attention.streaming else None
            rows.masks = {}
            for layer in range(l0, min(l0 + cfg.schedule.period_layers, self.model.num_layers)):
                mask = layer_mask(layer, pos, self.n, ct, heads, head_sets)
                rows.masks[layer] = self.out.row_masks[layer] = None if mask is None else mask.to(dev)
        if l0 in self.standins:
            group = self.runner.layers.stored(l0) // self.geometry.group_layers
            probe = self.runner.state.probe(self.prefix_id, group, cfg.selection.probe_bits, self.out).dequantize(self.model.dtype)
            rows.standin = (probe, self.standins[l0])
        if self.tail is not None:
            rows.tail = (*self.tail, self.runner.tail_pairs)
        return rows

    def loaded(self, p: int, l0: int, layers: int, chunk_tokens: list[int], q: torch.Tensor, first_keys) -> None:
        """Account for what Period ``p`` loaded, and keep what its attention mass is measured from
        (None for a sliding Period: not measured)."""
        self.out.tokens_loaded += sum(chunk_tokens)
        self.out.kv_fraction += sum(chunk_tokens) * layers / (self.n * self.model.num_layers)
        self.mass_inputs.append(None if l0 in self.plan.windowed else (q, first_keys, chunk_tokens, l0))

    def settle(self, stream) -> None:
        """The stream's counters, each selected chunk's attention mass and, when asked, its report."""
        out, st = self.out, stream.stats
        out.io_wait_s = stream.io_wait_s
        out.bytes_read, out.bytes_useful, out.num_reads = st.bytes_disk, st.bytes_useful, st.num_reads
        out.bytes_gpu, out.bytes_cpu = st.bytes_gpu, st.bytes_cpu
        out.units_disk, out.units_cpu, out.units_gpu = st.units_disk, st.units_cpu, st.units_gpu
        out.spec_bytes_used, out.spec_bytes_wasted = st.spec_bytes_used, st.spec_bytes_wasted
        out.groups_covered = st.groups_covered
        out.daemon_wait_s = st.daemon_wait_s
        out.chunk_attention = [
            torch.empty(0) if inp is None else torch.from_numpy(to_host(chunk_mass(self.model, *inp))) for inp in self.mass_inputs
        ]
        if self.cfg.report_attention:
            out.reported_units = self.report()

    def report(self) -> int:
        """``ReportAttention`` for every stored group of every Period: the daemon's cache scores."""
        units, geo = 0, self.geometry
        groups_per_period = self.cfg.schedule.period_layers // geo.group_layers
        for p, (chunks, mass) in enumerate(zip(self.out.selected, self.out.chunk_attention)):
            if self.mass_inputs[p] is None:  # a sliding Period: its window, not a selection to score
                continue
            first = self.stream_period(p, self.plan.periods[p][0]) * groups_per_period
            for g in range(first, min(first + groups_per_period, geo.num_groups)):
                units += self.runner.client.report_attention(self.prefix_id, g, chunks.numpy(), mass.numpy())
        return units
