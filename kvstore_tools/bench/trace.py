"""Re-Prefill traces: what a worker's client did with the daemon, request by request.

``kvstore-bench reprefill --workload zipf --trace-out PATH`` writes one JSON
object per line:

* a header (``kind``, ``version``): the model's config and fingerprint, the
  stored prefixes (tokens, so a replay stores the same ids), and per
  system x budget its stored geometry, ``ReprefillConfig``, daemon flags
  (memory, reserve, cache policy) and prefix ids, and how it was run;
* per request per system, in the order they ran: ``system``, ``budget``,
  ``request``, ``warmup``, ``prefix``, ``suffix_tokens``; ``events``, the
  client's calls to the daemon in order, each with ``t`` (seconds since the
  request's first call); ``periods``, the same per Period (the set sent,
  the look-ahead hint sent during it, each stored group received, the
  attention reported for each group); ``cpu``, the runner's measured CPU
  seconds (per-period selection, per-layer compute), for reference only.

Events (``op``): ``describe``; ``summaries`` / ``probe`` (client state
fetched: bytes, group); ``open`` (the Prefetch stream's flags); ``send``
(period, chunks, ``covered``: groups served from a push); ``hint`` (period,
chunks); ``group`` (a stored group waited for: rows and bytes received);
``close`` (the stream's ``PrefetchStats``); ``report`` (group, chunks,
mass); ``read`` (a decode-time ``ReadChunks``).

Recording wraps the runner's client (``RecordingClient``) and its Prefetch
stream; every call goes through unchanged, in the same order.
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from .io_jobs import BenchError

KIND = "kvstore-reprefill-trace"
VERSION = 1
_OPS = ("describe", "summaries", "probe", "open", "send", "hint", "group", "close", "report", "read")


class RecordingClient:
    """A ``KVStoreClient`` that logs the runner's daemon calls (``begin`` / ``take``)."""

    def __init__(self, client):
        self._client = client
        self._events: list[dict] = []
        self._t0 = time.perf_counter()

    def __getattr__(self, name):
        return getattr(self._client, name)

    def begin(self) -> None:
        self._events, self._t0 = [], time.perf_counter()

    def take(self) -> list[dict]:
        events, self._events = self._events, []
        return events

    def log(self, op: str, **fields) -> None:
        self._events.append({"op": op, "t": round(time.perf_counter() - self._t0, 6), **fields})

    def describe(self, prefix_id, **kw):
        self.log("describe")
        return self._client.describe(prefix_id, **kw)

    def get_summaries(self, prefix_id, **kw):
        arr = self._client.get_summaries(prefix_id, **kw)
        self.log("summaries", bytes=int(arr.nbytes), layer_step=int(kw.get("layer_step", 1)))
        return arr

    def get_probe_keys(self, prefix_id, group, **kw):
        arr = self._client.get_probe_keys(prefix_id, group, **kw)
        self.log("probe", group=int(group), bytes=int(arr.nbytes))
        return arr

    def prefetch(self, prefix_id, *, period_layers, speculate=True, hints=False, push=None, **kw):
        self.log("open", period_layers=period_layers, speculate=speculate, hints=hints, push=push)
        stream = self._client.prefetch(prefix_id, period_layers=period_layers, speculate=speculate, hints=hints, push=push, **kw)
        return RecordingStream(stream, self)

    def report_attention(self, prefix_id, group, chunks, attention, **kw):
        mass = np.asarray(attention, dtype=np.float32)
        self.log("report", group=int(group), chunks=_ints(chunks), mass=[float(x) for x in mass.ravel()])
        return self._client.report_attention(prefix_id, group, chunks, attention, **kw)

    def read_chunks(self, prefix_id, chunks, *, layer_start=0, layer_end=0, **kw):
        self.log("read", chunks=_ints(chunks), layers=[layer_start, layer_end])
        return self._client.read_chunks(prefix_id, chunks, layer_start=layer_start, layer_end=layer_end, **kw)


class RecordingStream:
    """A ``PrefetchStream`` that logs sets, hints, groups received and the closing stats."""

    def __init__(self, stream, rec: RecordingClient):
        self._stream = stream
        self._rec = rec

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def send(self, period, chunks) -> None:
        before = self._stream.covered
        self._stream.send(period, chunks)
        self._rec.log("send", period=int(period), chunks=_ints(chunks), covered=self._stream.covered - before)

    def hint(self, period, chunks) -> None:
        self._stream.hint(period, chunks)
        self._rec.log("hint", period=int(period), chunks=_ints(chunks))

    def group_kv(self, group):
        arr = self._stream.group_kv(group)
        self._rec.log("group", group=int(group), rows=int(arr.shape[3]), bytes=int(arr.nbytes))
        return arr

    def groups(self, period):
        for g in self._stream.period_groups(period):
            yield g, self.group_kv(g)

    def close(self):
        stats = self._stream.close()
        self._rec.log("close", stats=dataclasses.asdict(stats) if stats is not None else None)
        return stats

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self._stream.cancel()


def _ints(values) -> list[int]:
    return np.asarray(values).astype(np.int64).ravel().tolist()


def periods_view(events: list[dict], groups_per_period: int) -> list[dict]:
    """The events per Period: set sent, hint sent during it, groups received, reports per group."""
    out: list[dict] = []
    current = None
    for ev in events:
        if ev["op"] == "send":
            current = {"period": ev["period"], "chunks": ev["chunks"], "covered": ev["covered"], "hint": None, "groups": [], "reports": []}
            out.append(current)
        elif ev["op"] == "hint" and current is not None:
            current["hint"] = {"period": ev["period"], "chunks": ev["chunks"]}
        elif ev["op"] == "group" and current is not None:
            current["groups"].append({k: ev[k] for k in ("group", "rows", "bytes")})
        elif ev["op"] == "report":
            p = ev["group"] // groups_per_period
            if p < len(out):
                out[p]["reports"].append({k: ev[k] for k in ("group", "chunks", "mass")})
    return out


class TraceWriter:
    """Writes the header, then one line per request per system."""

    def __init__(self, path: str):
        try:
            self._f = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise BenchError(f"--trace-out: cannot write {path}: {exc.strerror}") from None

    def header(self, header: dict) -> None:
        self._write({"kind": KIND, "version": VERSION, **header})

    def request(self, record: dict) -> None:
        self._write(record)

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def request_record(run, index: int, warmup: bool, prefix: int, suffix, res, events: list[dict]) -> dict:
    """One traced request of ``run`` (a workload ``_Run``): its events, Periods and CPU times."""
    groups_per_period = run.cfg.schedule.period_layers // run.runner.geometry.group_layers
    return {
        "system": run.key,
        "budget": run.budget,
        "request": index,
        "warmup": warmup,
        "prefix": prefix,
        "prefix_id": run.ids[prefix],
        "suffix_tokens": _ints(suffix),
        "events": events,
        "periods": periods_view(events, groups_per_period),
        "cpu": {
            "ttft_s": res.ttft_s,
            "select_s": res.select_s,
            "compute_s": res.compute_s,
            "io_wait_s": res.io_wait_s,
            "period_select_s": list(res.period_select_s),
            "layer_compute_s": list(res.layer_compute_s),
        },
    }


def system_header(run) -> dict:
    """One system x budget of the header: what a replay needs to start the same daemon and store the same layout."""
    geo = run.runner.geometry
    return {
        "key": run.key,
        "name": run.key.split("@")[0],
        "budget": run.budget,
        "system": dataclasses.asdict(run.sysdef),
        "config": run.cfg.flat_fields(),  # flat, as traces have always recorded it
        "geometry": {**dataclasses.asdict(geo), "model": dataclasses.asdict(geo.model)},
        "daemon_flags": list(run.daemon_flags),
        "prefix_ids": list(run.ids),
        "client_state_bytes": run.state_bytes,
    }


def load_trace(path: str, systems) -> tuple[dict, list[dict]]:
    """``(header, request records)``; a ``BenchError`` naming ``--trace`` for anything a replay cannot use.

    ``systems``: the system names a replay knows (``workload.SYSTEMS``)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
    except OSError as exc:
        raise BenchError(f"--trace: cannot read {path}: {exc.strerror}") from None
    records = []
    for n, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"--trace: {path} line {n} is not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise BenchError(f"--trace: {path} line {n} is not a JSON object")
        records.append(obj)
    if not records or records[0].get("kind") != KIND:
        raise BenchError(f"--trace: {path} has no trace header on its first line (kvstore-bench reprefill --trace-out writes one)")
    header, requests = records[0], records[1:]
    if header.get("version") != VERSION:
        raise BenchError(f"--trace: {path} is trace version {header.get('version')!r}; this replay reads version {VERSION}")
    for key in ("model", "prefixes", "systems", "run"):
        if key not in header:
            raise BenchError(f"--trace: {path} header lacks {key!r}")
    known = {}
    for s in header["systems"]:
        if s.get("name") not in systems:
            raise BenchError(f"--trace: {path} names unknown system {s.get('name')!r} (known: {', '.join(systems)})")
        known[s["key"]] = s
    for n, r in enumerate(requests, 2):
        if r.get("system") not in known:
            raise BenchError(f"--trace: {path} line {n} is for system {r.get('system')!r}, not in the header")
        if not isinstance(r.get("events"), list) or any(not isinstance(e, dict) or e.get("op") not in _OPS for e in r["events"]):
            raise BenchError(f"--trace: {path} line {n} has a missing or unknown event")
        if not isinstance(r.get("prefix"), int) or not 0 <= r["prefix"] < len(header["prefixes"]):
            raise BenchError(f"--trace: {path} line {n} names prefix {r.get('prefix')!r}, not one of the header's")
    if not requests:
        raise BenchError(f"--trace: {path} has a header but no requests")
    return header, requests
