"""``kvstore-admin conversations`` and ``conversation ID``: conversation records as tables.

``STORED`` is the segment bytes of the record's stored prefixes (shared
chunks once), ``RATIO`` uncompressed over compressed KV, ``MISSING`` the
prefixes the record names that are no longer stored.  The compressed form's
strategy is the client's JSON object; a worker's recorded statistics
(``engine_client.krul.record_strategy``: ``selector``, ``edge_mass``) get
lines of their own where they have that shape.
"""

from __future__ import annotations

import json

from kvstore_tools.fmt import format_table, human_bytes, when


def _ratio(info: dict) -> str:
    """Uncompressed over compressed KV bytes: what the compressed form saves."""
    return f"{info['uncompressed_bytes'] / info['compressed_bytes']:.1f}x" if info["compressed_bytes"] else "-"


def _readable(info: dict) -> dict:
    """The conversation for output: the compressed form's strategy as an object, not its JSON text."""
    comp = info["compressed"]
    if comp is not None:
        comp = {**{k: v for k, v in comp.items() if k != "strategy_json"}, "strategy": json.loads(comp["strategy_json"] or "{}")}
    return {**info, "compressed": comp}


def cmd_conversations(admin, args) -> tuple[object, str, int]:
    items = [_readable(c) for c in admin.list_conversations(args.namespace)]
    rows = [
        [
            c["conversation_id"],
            c["namespace"] or "-",
            c["state"],
            c["num_turns"],
            c["num_tokens"],
            c["compressed"]["format"] if c["compressed"] else "-",
            human_bytes(c["stored_bytes"]),
            human_bytes(c["uncompressed_bytes"]),
            human_bytes(c["compressed_bytes"]) if c["compressed"] else "-",
            _ratio(c),
            c["missing_prefixes"],
            when(c["updated"]),
        ]
        for c in items
    ]
    # STORED: segment bytes of its stored prefixes, shared chunks once; RATIO: uncompressed / compressed; MISSING: prefixes gone
    headers = ["CONVERSATION", "NAMESPACE", "STATE", "TURNS", "TOKENS", "FORMAT", "STORED", "UNCOMPRESSED", "COMPRESSED", "RATIO"]
    headers += ["MISSING", "UPDATED"]
    text = format_table(headers, rows, right={3, 4, 6, 7, 8, 9, 10}) + f"\n{len(items)} conversations"
    return items, text, 0


def _strategy_lines(strategy: dict) -> list[list[str]]:
    """The strategy's own fields on one line; a worker's recorded statistics (``krul.record_strategy``:
    ``selector``, ``edge_mass``), where they have that shape, on lines of their own."""
    rest, lines = dict(strategy), []
    selector = rest.get("selector")
    if isinstance(selector, dict) and {"gamma", "ratio", "non_ir", "pairs"} <= set(selector):
        del rest["selector"]
        lines.append(
            [
                "selector",
                f"gamma {selector['gamma']}, ratio {selector['ratio']}: input-sensitive layers "
                f"{json.dumps(selector['non_ir'])}, pairs {json.dumps(selector['pairs'])}",
            ]
        )
    edge = rest.get("edge_mass")
    if isinstance(edge, list) and edge and all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in edge):
        del rest["edge_mass"]
        lines.append(["edge mass", f"per layer {' '.join(f'{e:.2f}' for e in edge)}"])
    return [["strategy", json.dumps(rest, sort_keys=True)], *lines]


def cmd_conversation(admin, args) -> tuple[object, str, int]:
    info = _readable(admin.get_conversation(args.conversation_id, args.namespace))
    comp = info["compressed"]
    head = [
        ["conversation", info["conversation_id"]],
        ["namespace", info["namespace"] or "-"],
        ["model", info["model_fingerprint"] or "-"],
        ["state", info["state"]],
        ["turns", info["num_turns"]],
        ["tokens", info["num_tokens"]],
        ["stored", f"{human_bytes(info['stored_bytes'])} on disk ({info['missing_prefixes']} prefixes no longer stored)"],
        ["uncompressed", human_bytes(info["uncompressed_bytes"])],
        ["compressed", "-" if comp is None else f"{human_bytes(info['compressed_bytes'])} ({_ratio(info)} smaller)"],
        ["created", when(info["created"])],
        ["updated", when(info["updated"])],
    ]
    if comp is not None:
        head += [
            ["compressed prefix", f"{comp['prefix_id']}{'' if comp['stored'] else ' (NOT STORED)'}"],
            ["format", comp["format"]],
            *_strategy_lines(comp["strategy"]),
        ]
    rows = [
        [
            t["turn"],
            t["prefix_id"],
            t["num_tokens"],
            human_bytes(t["kv_bytes"]),
            when(t["created"]),
            "yes" if t["stored"] else "NOT STORED",
        ]
        for t in info["turns"]
    ]
    text = (
        format_table(None, head)
        + "\n\n"
        + format_table(["TURN", "PREFIX", "TOKENS", "KV BYTES", "CREATED", "STORED"], rows, right={0, 2, 3})
    )
    return info, text, 0
