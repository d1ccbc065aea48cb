"""The replay's modelled rows: recompute, and the product's choice per request.

* ``recompute``: each timed request's prefix and suffix prefilled through
  every layer under the profile, then the first token's logits; nothing is
  read, so no daemon is involved (``path_choice.recompute_seconds``).
* ``choice@B``: per timed request, ``path_choice.choose`` predicts recompute,
  full load and the sparse path at budget ``B`` from the profile and the
  request's shape, and the row takes the *replayed* time of the path it
  chose for that same request (the recompute row's, the full-load system's,
  or the budget's reference system's).  The prediction picks; the
  measurement times.  Where the choice runs the sparse path without
  speculation (a Period's compute cannot hide a read on this profile), the
  reference system is replayed a second time with speculation off
  (``NAME-nospec@B``, its own row) and the choice takes that replay.  A
  profile without a disk rate (a named one) cannot cost the loading paths:
  there is no choice row then, and the report says why (``kvstore-bench
  calibrate`` writes a profile that has one).  As on a runner
  (``path_choice.PathHistory``), each path's replayed time over its
  prediction reprices that path for the requests after it, warm-up ones
  included (the recompute row is modelled: its ratio is 1).
"""

from __future__ import annotations

from engine_client.path_choice import PathHistory, RequestShape, choose, recompute_seconds, speculation

NO_SPECULATION = "-nospec"  # the reference system replayed with speculation off: NAME-nospec@B

_ZERO = ("select_s", "io_wait_s", "h2d_s", "fetch_s", "other_s", "bytes_disk", "state_bytes", "bytes_memory", "bytes_received", "spec_used")


def recompute_rows(header: dict, base_rows: list[dict], config, profile) -> list[dict]:
    """One modelled recompute row per request of ``base_rows`` (any replayed system's, same requests)."""
    out = []
    for r in base_rows:
        n = header["prefixes"][r["prefix"]]["num_tokens"]
        shape = RequestShape(n, int(header["run"]["suffix_tokens"]), 0, 1, 1.0)
        seconds = recompute_seconds(config, profile, shape)
        row = {k: 0.0 for k in _ZERO} | {"spec_wasted": 0.0, "bytes_useful": 0.0}
        row.update(system="recompute", request=r["request"], warmup=r["warmup"], prefix=r["prefix"], ttft_s=seconds, compute_s=seconds)
        row.update(cpu_ttft_s=None, sets=[], hints=[], groups=[])
        out.append(row)
    return out


def _shape(header: dict, req: dict, ref: dict, geo, config, state_bytes: int) -> RequestShape:
    n = header["prefixes"][req["prefix"]]["num_tokens"]
    return RequestShape(
        n,
        int(header["run"]["suffix_tokens"]),
        int(geo.kv_bytes(n)),
        -(-config.num_hidden_layers // ref["config"]["period_layers"]),
        float(ref["budget"]),
        state_bytes=state_bytes,
        scored_rows=n,
    )


def _references(systems: list[dict]) -> dict[str, dict]:
    """Each budget's reference system (``contiguouskv`` where the trace has it)."""
    budgets: dict[str, list[dict]] = {}
    for s in systems:
        if s["system"]["budgeted"] and not s.get("no_speculation"):
            budgets.setdefault(s["key"].split("@")[1], []).append(s)
    return {b: next((s for s in members if s["name"] == "contiguouskv"), members[0]) for b, members in budgets.items()}


def no_speculation_systems(header: dict, systems: list[dict], requests: list[dict], config, profile, geometry_of) -> tuple[list, list]:
    """The reference systems to replay again with speculation off, and their requests: those whose trace
    speculated where the profile says a Period's compute cannot hide a read (only when a choice row can be made)."""
    if profile.disk_bytes_per_s is None or not any(not s["system"]["budgeted"] for s in systems):
        return [], []
    extra, extra_requests = [], []
    for budget, ref in _references(systems).items():
        mine = [r for r in requests if r["system"] == ref["key"]]
        speculated = any(ev["op"] == "open" and ev["speculate"] for r in mine for ev in r["events"])
        geo = geometry_of(ref)
        if not speculated or all(speculation(config, profile, _shape(header, r, ref, geo, config, 0)).pays for r in mine):
            continue
        name = ref["name"] + NO_SPECULATION
        variant = {**ref, "key": f"{name}@{budget}", "name": name, "no_speculation": True}
        extra.append(variant)
        extra_requests += [{**r, "system": variant["key"]} for r in mine]
    return extra, extra_requests


def choice_rows(header: dict, systems: list[dict], records: dict, config, profile, geometry_of) -> tuple[dict, str | None]:
    """``{"choice@B": rows}`` for each budget with a reference system, or ``({}, why not)``."""
    if profile.disk_bytes_per_s is None:
        return {}, f"no choice row: profile {profile.name} has no disk rate (use --profile file:PATH from kvstore-bench calibrate)"
    full = next((s for s in systems if not s["system"]["budgeted"] and s["key"] in records), None)
    if full is None or "recompute" not in records:
        return {}, "no choice row: the replay has no full-load system"
    by_request = {key: {r["request"]: r for r in rows} for key, rows in records.items()}
    geo = geometry_of(full)
    out = {}
    for budget, ref in _references([s for s in systems if s["key"] in records]).items():
        quiet = f"{ref['name']}{NO_SPECULATION}@{budget}"
        rows, history = [], PathHistory()
        for r in records[ref["key"]]:
            shape = _shape(header, r, ref, geo, config, int(r["state_bytes"]))
            c = choose(config, profile, shape, history.ratios_for(profile, shape))
            sparse = quiet if c.speculate is False and quiet in records else ref["key"]
            source = {"recompute": "recompute", "full-load": full["key"], "sparse": sparse}[c.path]
            measured = by_request[source].get(r["request"])
            if measured is None:
                continue
            history.record(profile, c.path, shape, c.modelled[c.path], measured["ttft_s"])
            rows.append(
                measured
                | {"system": f"choice@{budget}", "chosen": c.path, "predicted": c.predicted, "modelled": c.modelled, "reason": c.reason}
            )
        out[f"choice@{budget}"] = rows
    return out, None
