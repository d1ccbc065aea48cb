"""The replay's modelled rows: recompute, and the product's choice per request.

* ``recompute``: each timed request's prefix and suffix prefilled through
  every layer under the profile, then the first token's logits; nothing is
  read, so no daemon is involved (``path_choice.recompute_seconds``).
* ``choice@B``: per timed request, ``path_choice.choose`` predicts recompute,
  full load and the sparse path at budget ``B`` from the profile and the
  request's shape, and the row takes the *replayed* time of the path it
  chose for that same request (the recompute row's, the full-load system's,
  or the budget's reference system's).  The prediction picks; the
  measurement times.  A profile without a disk rate (a named one) cannot
  cost the loading paths: there is no choice row then, and the report says
  why (``kvstore-bench calibrate`` writes a profile that has one).
"""

from __future__ import annotations

from engine_client.path_choice import RequestShape, choose, recompute_seconds

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
    budgets: dict[str, list[dict]] = {}
    for s in systems:
        if s["system"]["budgeted"] and s["key"] in records:
            budgets.setdefault(s["key"].split("@")[1], []).append(s)
    for budget, members in budgets.items():
        ref = next((s for s in members if s["name"] == "contiguouskv"), members[0])
        period_layers = ref["config"]["period_layers"]
        rows = []
        for r in records[ref["key"]]:
            n = header["prefixes"][r["prefix"]]["num_tokens"]
            shape = RequestShape(
                n,
                int(header["run"]["suffix_tokens"]),
                int(geo.kv_bytes(n)),
                -(-config.num_hidden_layers // period_layers),
                float(ref["budget"]),
                state_bytes=int(r["state_bytes"]),
                scored_rows=n,
            )
            c = choose(config, profile, shape)
            source = {"recompute": "recompute", "full-load": full["key"], "sparse": ref["key"]}[c.path]
            measured = by_request[source].get(r["request"])
            if measured is None:
                continue
            rows.append(measured | {"system": f"choice@{budget}", "chosen": c.path, "predicted": c.predicted, "reason": c.reason})
        out[f"choice@{budget}"] = rows
    return out, None
