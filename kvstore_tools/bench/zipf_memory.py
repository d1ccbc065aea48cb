"""The Zipf bench's memory: each system's daemon gets one arena, its CPU tier ``--memory-fraction`` of the
stored bytes less the client state the system keeps resident, plus a prefetch reserve (``memory_split``)."""

from __future__ import annotations

from .io_jobs import BenchError

SLOT = 64 << 10


def memory_split(geo, args, client_state_bytes: int = 0) -> tuple[int, float]:
    """The daemon's memory: a CPU tier of ``memory_fraction`` of the stored bytes
    less the client state the system keeps resident (rounded up to a slot),
    plus a prefetch reserve of three periods' worth of a whole prefix (what a
    full-load request may hold at once), carved from the same arena.
    Returns ``(arena bytes, reserve fraction)``."""
    per_prefix = extent_bytes(geo, args.prefix_tokens)
    budget = int(args.memory_fraction * per_prefix * args.prefixes) // SLOT * SLOT
    tier = budget - -(-client_state_bytes // SLOT) * SLOT
    if tier < SLOT:
        raise BenchError(f"client state of {client_state_bytes} bytes leaves no CPU tier in {budget} bytes of memory")
    per_period = per_prefix * min(args.period_layers, geo.model.num_layers) // geo.model.num_layers
    reserve = -(-3 * per_period // SLOT) * SLOT
    return tier + reserve, reserve / (tier + reserve)


def extent_bytes(geo, n: int) -> int:
    m = geo.model
    return m.num_layers * 2 * m.num_kv_heads * m.head_dim * m.numpy_dtype().itemsize * n


def probe_state_bytes(geo, num_tokens: int, bits: int) -> int:
    """Quantized probe keys a client keeps resident for one prefix: every stored group's
    ``[Hkv, n, d]`` keys at ``bits`` bits plus one float32 scale per (head, token)."""
    from kvstore.contract.geometry import quantized_row_bytes

    m = geo.model
    return geo.num_groups * m.num_kv_heads * num_tokens * quantized_row_bytes(m.head_dim, bits)


def window_tail_bytes(geo, tail, num_tokens: int) -> int:
    """A window tail (``engine_client.reprefill.window.WindowTail``) a runner keeps resident for one prefix:
    its row positions (int64) and each (sliding layer, KV head) pair's K and V rows in the KV dtype."""
    rows = min(num_tokens, -(-tail.recent_tokens // geo.chunk_tokens) * geo.chunk_tokens)
    return rows * 8 + len(tail.pairs) * 2 * rows * geo.model.head_dim * geo.model.numpy_dtype().itemsize
