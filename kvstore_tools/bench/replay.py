"""``kvstore-bench replay``: a recorded Re-Prefill trace against a real daemon at an accelerator's speed.

On a CPU the model's compute is nearly all of a Re-Prefill's TTFT, which
hides what the storage tier does for a GPU worker.  A replay keeps the
daemon, its socket, its tiers and its disk reads real and replaces only the
client's compute with the time ``compute_model`` gives for it:

* each system x budget of the trace gets its own daemon, started with the
  recorded flags (memory, prefetch reserve, cache policy) on a fresh data
  directory, and the trace's prefixes stored with the recorded geometry and
  tokens (so the same prefix ids; the KV bytes are synthetic: no timing
  depends on them);
* each traced request, warm-up ones included (they fill the tiers), is
  driven through the client calls the runner made, in its order: the same
  Prefetch stream flags, state fetches (key summaries, probe keys), sets,
  look-ahead hints and attention reports;
* where the runner computed, the replay waits the modelled time instead:
  a Period's selection (its first layer's query projection plus scoring,
  ``compute_model.score_seconds``: ``q . k`` over the rows scored - two
  per chunk for key summaries, every prefix row for probe keys, IMPRESS's
  one KV head and half the channels; none for H2O's fixed set or a full
  load) before its set is sent, the hint's selection before the hint, and
  per stored group as it arrives the host-to-device copy of the bytes
  received plus each layer's ``layer_seconds(config, suffix tokens, rows
  received)`` (with the runner's ``overlap`` off, after the whole Period),
  then the first token's logits (``lm_head_seconds``).  A Period's set is
  sent only after the previous Period's compute, as in the runner.

The client's own host work is what a runner on a GPU does: the stream is
opened without waiting for its header (``wait_header=False``), and a
group's extents are copied as stored into a buffer kept across groups
(``group_out_chunks``, what ``reprefill.staging`` does into pinned memory)
where the layout allows, gathered by rows otherwise.

TTFT is wall time on this machine from the Prefetch stream's opening to the
logits, as the runner measures it: real I/O waits plus modelled compute.
Decode-time reads (``--task`` runs) are not replayed; attention reports go
to the daemon after TTFT, as the runner sends them.

``--concurrency 1,2,4,8`` then replays the timed requests from that many
clients at once on each system's daemon (``_concurrent``), each client
starting at a different request; a request that fails (e.g. no arena space
within ``lease_wait_seconds``) is counted with its status, not hidden.  The
command line, and several traces at once for a table against prefix
length, are ``replay_cli``.

Two rows are modelled rather than replayed (``replay_choice``): ``recompute``
(prefix and suffix prefilled under the profile, nothing read) and, with a
measured profile, ``choice@B`` (per request, the path ``path_choice``
predicts cheapest, timed by that path's replayed row for the request).

When the trace has no system that loads every chunk (``as-lru``), a
``full-load`` row is added: the first chunk system's requests with every
chunk of every Period, LRU tiers, speculation of the next Period (layer-wise
preloading) and the memory without client state; its reports are uniform.
"""

from __future__ import annotations

import copy
import os
import shutil
import time

import numpy as np

from engine_client.compute_model import h2d_seconds, layer_seconds, lm_head_seconds, parse_profile, query_seconds, score_seconds
from kvstore.contract.errors import InvalidArgument

from .io_jobs import BenchError
from .replay_choice import choice_rows, no_speculation_systems, recompute_rows
from .replay_report import concurrency_level
from .trace import load_trace

SPIN_S = 2e-4  # the last part of each wait is spun (sleep(0) yields the GIL) for sub-millisecond accuracy


class Clock:
    """Waits modelled seconds; an overshoot is taken off the next wait, so a request's sum stays right."""

    def __init__(self):
        self.debt = 0.0

    def wait(self, seconds: float) -> None:
        target = seconds - self.debt
        if target <= 0:
            self.debt = -target
            return
        deadline = time.perf_counter() + target
        if target > SPIN_S:
            time.sleep(target - SPIN_S)
        while time.perf_counter() < deadline:
            time.sleep(0)
        self.debt = time.perf_counter() - deadline


def selection_cost(system: dict, config, profile, suffix: int, num_tokens: int, num_chunks: int, chunks_sent: int) -> float:
    """Modelled seconds of one selection: the first layer's queries, then scoring (module docstring)."""
    q = query_seconds(config, suffix, profile)
    kind, cfg = system["system"]["selection"], system["config"]
    if kind == "summary":
        kind = cfg["selector"]
    if kind in ("full", "h2o", "recent") or chunks_sent >= num_chunks:
        return q
    if kind == "summary":  # a min and a max row per chunk
        return q + score_seconds(config, suffix, 2 * num_chunks, profile)
    if kind == "impress":  # one KV head's query heads, half the channels
        return q + score_seconds(config, suffix, num_tokens, profile, head_fraction=1 / config.num_key_value_heads, channel_fraction=0.5)
    bits = cfg.get("probe_bits", 0)  # exact, or a named per-layer system scoring probe keys
    row_bytes = config.num_key_value_heads * (config.head_dim * bits // 8 + 4) if bits else None
    return q + score_seconds(config, suffix, num_tokens, profile, row_bytes=row_bytes)


def _geometry(system: dict):
    from kvstore.contract.geometry import ModelSpec, StoreGeometry

    g = dict(system["geometry"])
    return StoreGeometry(ModelSpec(**g.pop("model")), **g)


def _synthetic_kv(geo, num_tokens: int, seed: int) -> np.ndarray:
    """``[layers, 2, kv_heads, tokens, head_dim]`` of random finite values (bfloat16 as raw uint16)."""
    m = geo.model
    vals = np.random.default_rng(seed).standard_normal((m.num_layers, 2, m.num_kv_heads, num_tokens, m.head_dim), dtype=np.float32)
    if m.dtype == "bfloat16":
        return (vals.view(np.uint32) >> 16).astype(np.uint16)
    return vals.astype(m.numpy_dtype())


def _store_prefixes(client, header: dict, system: dict, geo) -> None:
    fingerprint = header["model"]["fingerprint"]
    for i, p in enumerate(header["prefixes"]):
        tokens = np.asarray(p["tokens"], dtype=np.int64)
        got = client.put_prefix(tokens, _synthetic_kv(geo, tokens.size, i), geo, model_fingerprint=fingerprint).prefix_id
        if got != system["prefix_ids"][i]:
            raise BenchError(f"--trace: prefix {i} of {system['key']} stored as {got[:12]}, not the traced {system['prefix_ids'][i][:12]}")


class _Buffers:
    """Host buffers a client's groups are copied into, kept across its groups and requests as a runner's pinned ring is."""

    def __init__(self):
        self._by_size: dict[int, np.ndarray] = {}

    def get(self, shape, dtype) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = self._by_size.get(nbytes)
        if buf is None:
            buf = self._by_size[nbytes] = np.empty(nbytes, dtype=np.uint8)
        return buf.view(dtype).reshape(shape)


def replay_request(client, geo, system: dict, req: dict, config, profile, num_tokens: int, buffers: _Buffers | None = None) -> dict:
    """Drive one traced request through the daemon; TTFT and its breakdown (module docstring).  ``buffers``:
    the client's host buffers, kept across its requests (a new set when None)."""
    s, m = len(req["suffix_tokens"]), geo.num_chunks(num_tokens)
    overlap = system["config"]["overlap"]
    clock, pid = Clock(), req["prefix_id"]
    out = {k: 0.0 for k in ("select_s", "compute_s", "h2d_s", "fetch_s")}
    out.update(system=system["key"], request=req["request"], warmup=req["warmup"], prefix=req["prefix"], sets=[], hints=[], groups=[])
    stream = stats = None
    t_start = pending = None
    buffers = _Buffers() if buffers is None else buffers
    state_bytes = 0
    try:
        for ev in req["events"]:
            op = ev["op"]
            if op == "describe":
                client.describe(pid)
            elif op == "open":
                t_start, pending = time.perf_counter(), 0.0
                speculate = ev["speculate"] and not system.get("no_speculation", False)
                # as the runner opens it: the header's round trip overlaps the first selection
                stream = client.prefetch(
                    pid, period_layers=ev["period_layers"], speculate=speculate, hints=ev["hints"], push=ev["push"], wait_header=False
                )
                stream.group_out_chunks = buffers.get
            elif op in ("summaries", "probe"):
                t0 = time.perf_counter()
                if op == "summaries":  # a trace from before layer_step fetched every layer
                    arr = client.get_summaries(pid, layer_step=ev.get("layer_step", 1))
                else:
                    arr = client.get_probe_keys(pid, ev["group"])
                state_bytes += arr.nbytes
                out["fetch_s"] += time.perf_counter() - t0
            elif op in ("send", "hint"):
                cost = selection_cost(system, config, profile, s, num_tokens, m, len(ev["chunks"]))
                clock.wait(cost)
                out["select_s"] += cost
                if op == "send":
                    stream.send(ev["period"], ev["chunks"])
                    out["sets"].append([ev["period"], ev["chunks"]])
                else:
                    stream.hint(ev["period"], ev["chunks"])
                    out["hints"].append([ev["period"], ev["chunks"]])
            elif op == "group":
                g = ev["group"]
                arr = stream.group_kv(g)
                rows = int(arr.shape[0] * arr.shape[4]) if arr.ndim == 6 else int(arr.shape[3])  # as stored, or by rows
                out["groups"].append([g, rows, int(arr.nbytes)])
                h2d = h2d_seconds(arr.nbytes, profile)
                pending += h2d + sum(layer_seconds(config, s, rows, profile).total for _ in geo.group_layer_range(g))
                out["h2d_s"] += h2d
                last = stream.period_groups(g // stream.groups_per_period)[-1] == g
                if overlap or last:
                    clock.wait(pending)
                    out["compute_s"] += pending
                    pending = 0.0
            elif op == "close":
                head = lm_head_seconds(config, profile)
                clock.wait(head)
                out["compute_s"] += head
                out["ttft_s"] = time.perf_counter() - t_start
                out["io_wait_s"] = stream.io_wait_s
                stats = stream.close()
                stream = None
            elif op == "report":
                client.report_attention(pid, ev["group"], ev["chunks"], ev["mass"])
    finally:
        if stream is not None:
            stream.cancel()
    if stats is None:
        raise BenchError(f"--trace: request {req['request']} of {req['system']} never closes its Prefetch stream")
    out["other_s"] = out["ttft_s"] - out["select_s"] - out["compute_s"] - out["io_wait_s"] - out["fetch_s"]
    out["bytes_disk"] = stats.bytes_disk + state_bytes
    out["state_bytes"] = state_bytes
    out["bytes_memory"] = stats.bytes_cpu + stats.bytes_gpu
    out["bytes_useful"] = stats.bytes_useful
    out["bytes_received"] = sum(g[2] for g in out["groups"])
    out["spec_used"], out["spec_wasted"] = stats.spec_bytes_used, stats.spec_bytes_wasted
    cpu = req.get("cpu", {})
    out["cpu_ttft_s"] = cpu.get("ttft_s")
    out["cpu_io_wait_s"], out["cpu_compute_s"], out["cpu_select_s"] = cpu.get("io_wait_s"), cpu.get("compute_s"), cpu.get("select_s")
    return out


def full_load_system(header: dict, requests: list[dict]) -> tuple[dict, list[dict]] | None:
    """The ``full-load`` system and requests the module docstring describes; None when the trace has one."""
    from .zipf_memory import SLOT

    systems = header["systems"]
    if any(not s["system"]["budgeted"] for s in systems):
        return None
    base = next((s for s in systems if s["system"]["chunk_tokens"] == 16), systems[0])
    sysinfo = copy.deepcopy(base)
    sysinfo.update(key="full-load@1", name="full-load", budget=1.0, client_state_bytes=0)
    sysinfo["system"].update(selection="full", policy="lru", speculate=True, overlap=True, budgeted=False, lookahead=0.0, push=True)
    sysinfo["config"].update(budget=1.0, selector="full", speculate=True, overlap=True, lookahead=0.0, push=True)
    flags = sysinfo["daemon_flags"]
    arena, fraction = int(flags[flags.index("--shm-arena-bytes") + 1]), float(flags[flags.index("--prefetch-reserve-fraction") + 1])
    reserve = round(arena * fraction)
    arena += -(-base["client_state_bytes"] // SLOT) * SLOT  # the memory the base system's client state took
    flags[flags.index("--shm-arena-bytes") + 1] = str(arena)
    flags[flags.index("--prefetch-reserve-fraction") + 1] = repr(reserve / arena)
    flags[flags.index("--cache-policy") + 1] = "lru"
    geo = _geometry(sysinfo)
    per_period = sysinfo["config"]["period_layers"] // geo.group_layers
    out = []
    for req in (r for r in requests if r["system"] == base["key"]):
        n = header["prefixes"][req["prefix"]]["num_tokens"]
        m = geo.num_chunks(n)
        every = list(range(m))
        events = [
            {"op": "describe"},
            {"op": "open", "period_layers": sysinfo["config"]["period_layers"], "speculate": True, "hints": False, "push": None},
        ]
        for p in range(-(-geo.num_groups // per_period)):
            events.append({"op": "send", "period": p, "chunks": every})
            for g in range(p * per_period, min((p + 1) * per_period, geo.num_groups)):
                events.append({"op": "group", "group": g, "rows": n, "bytes": geo.layers_in_group(g) * n * geo.model.token_layer_bytes})
        events.append({"op": "close"})
        events += [{"op": "report", "group": g, "chunks": every, "mass": [1.0 / m] * m} for g in range(geo.num_groups)]
        out.append({**req, "system": sysinfo["key"], "prefix_id": sysinfo["prefix_ids"][req["prefix"]], "events": events, "cpu": {}})
    return sysinfo, out


def run_replay(args) -> dict:
    from engine_client.client import KVStoreClient
    from engine_client.model.config import ModelConfig
    from kvstore.progress import bar

    from .daemon_io import DaemonArgs, _Daemon
    from .replay_report import summarize_replay

    profile = profile_arg(args.profile)
    from .zipf_systems import SYSTEMS

    header, requests = load_trace(args.trace, SYSTEMS)
    try:
        config = ModelConfig(**header["model"]["config"])
    except (TypeError, ValueError) as exc:
        raise BenchError(f"--trace: the header's model config is not usable: {exc}") from None
    systems = list(header["systems"])
    extra = full_load_system(header, requests)
    if extra is not None:
        systems.append(extra[0])
        requests = requests + extra[1]
    if args.systems:
        keys = {s["key"] for s in systems}
        unknown = [k for k in args.systems if k not in keys]
        if unknown:
            raise BenchError(f"--systems: {', '.join(unknown)} not in the trace (it has {', '.join(sorted(keys))})")
        systems = [s for s in systems if s["key"] in args.systems]
    quiet, quiet_requests = no_speculation_systems(header, systems, requests, config, profile, _geometry)
    systems, requests = systems + quiet, requests + quiet_requests
    records: dict[str, list[dict]] = {}
    daemon_bytes: dict[str, int] = {}
    concurrency: dict[str, dict[int, dict]] = {}
    chosen = {s["key"] for s in systems}
    extra_streams = sum(c for c in args.concurrency if c > 1)
    total = sum(1 + (0 if r["warmup"] else extra_streams) for r in requests if r["system"] in chosen)
    progress = bar(total, "replay", unit="req")
    try:
        for system in systems:
            geo = _geometry(system)
            data_dir = os.path.join(args.directory, "replay-store", system["key"])
            shutil.rmtree(data_dir, ignore_errors=True)
            daemon = _Daemon(data_dir, DaemonArgs(args.backend, args.iodepth), extra=system["daemon_flags"])
            try:
                with KVStoreClient(f"unix:{daemon.socket}") as client:
                    _store_prefixes(client, header, system, geo)
                    before = client.stats().bytes_read
                    rows = records[system["key"]] = []
                    buffers = _Buffers()  # the client's, across its requests
                    for req in (r for r in requests if r["system"] == system["key"]):
                        n = header["prefixes"][req["prefix"]]["num_tokens"]
                        rows.append(replay_request(client, geo, system, req, config, profile, n, buffers))
                        progress.update(1)
                    daemon_bytes[system["key"]] = client.stats().bytes_read - before
                timed = [r for r in rows if not r["warmup"]]
                mine = [r for r in requests if r["system"] == system["key"] and not r["warmup"]]  # the traced ones
                for streams in (c for c in args.concurrency if c > 1):
                    level = _concurrent(f"unix:{daemon.socket}", geo, system, mine, config, profile, header, streams)
                    concurrency.setdefault(system["key"], {})[streams] = level
                    progress.update(len(mine) * streams)
                if timed and 1 in args.concurrency:
                    concurrency.setdefault(system["key"], {})[1] = concurrency_level(timed, 1, sum(r["ttft_s"] for r in timed), [])
            finally:
                daemon.stop()
                shutil.rmtree(data_dir, ignore_errors=True)
    finally:
        progress.close()
    modelled = []
    if records:
        records["recompute"] = recompute_rows(header, next(iter(records.values())), config, profile)
        choices, why_not = choice_rows(header, systems, records, config, profile, _geometry)
        records.update(choices)
        modelled = [{"key": "recompute", "kind": "recompute", "system": {"budgeted": False}}]
        modelled += [{"key": key, "kind": "choice", "system": {"budgeted": False}} for key in choices]
        daemon_bytes.update(dict.fromkeys([m["key"] for m in modelled], 0))
    report = summarize_replay(header, systems + modelled, records, daemon_bytes, profile, args.trace)
    report["choice_note"] = why_not if records else None
    report["concurrency"] = {key: {str(c): level for c, level in sorted(levels.items())} for key, levels in concurrency.items()}
    return report


def _concurrent(target: str, geo, system: dict, timed: list[dict], config, profile, header: dict, streams: int) -> dict:
    """``streams`` clients on one daemon at once, each replaying every timed request (each from its own start)."""
    import threading

    from engine_client.client import KVStoreClient, KVStoreRpcError

    results: list[list[dict]] = [[] for _ in range(streams)]
    failures: list[str] = []  # each failed request's status and message

    buffers = [_Buffers() for _ in range(streams)]  # each client's own

    def work(k: int) -> None:
        with KVStoreClient(target) as client:
            start = k % len(timed)
            for req in timed[start:] + timed[:start]:
                n = header["prefixes"][req["prefix"]]["num_tokens"]
                try:
                    results[k].append(replay_request(client, geo, system, req, config, profile, n, buffers[k]))
                except KVStoreRpcError as exc:  # e.g. no arena space within lease_wait_seconds: counted, not hidden
                    failures.append(str(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [r for per in results for r in per]
    return concurrency_level(rows, streams, time.perf_counter() - t0, failures)


def profile_arg(text: str):
    """``--profile``: an ``AcceleratorProfile``; a one-line ``BenchError`` naming the flag (and key) otherwise."""
    try:
        return parse_profile(text)
    except InvalidArgument as exc:
        raise BenchError(f"--{exc}") from None
