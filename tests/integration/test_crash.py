"""SIGKILL in the middle of puts and deletes loses nothing acknowledged and lists nothing unacknowledged."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers import data_root, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.hashing import chunk_hashes
from kvstore.store import ChunkStore

GEO = StoreGeometry(ModelSpec(24, 2, 64, "bfloat16"), chunk_tokens=16, group_layers=8)
NUM_PUTS = 400
TOKENS = 400


def prefix_inputs(i: int):
    """Prefix i; odd ones share their first 256 tokens with prefix i-1."""
    tokens = make_tokens(TOKENS, i)
    kv = make_kv(GEO, TOKENS, i)
    if i % 2:
        tokens[:256] = make_tokens(TOKENS, i - 1)[:256]
        kv[:, :, :, :256] = make_kv(GEO, TOKENS, i - 1)[:, :, :, :256]
    return tokens, kv


WRITER = textwrap.dedent(
    """
    import sys, threading
    sys.path[:0] = [{root!r}, {root!r} + "/tests", {tests!r}]
    from test_crash import GEO, NUM_PUTS, prefix_inputs
    from kvstore.config import StoreConfig
    from kvstore.store import ChunkStore

    store = ChunkStore(StoreConfig(data_dir={data!r}, min_free_bytes=0, index_map_bytes=1 << 16))
    lock = threading.Lock()
    def say(line):
        with lock:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()
    def worker(k):
        for i in range(k, NUM_PUTS, 4):
            tokens, kv = prefix_inputs(i)
            say(f"BEGIN {{i}}")
            res = store.put(tokens, kv, GEO)
            say(f"ACK {{i}} {{res.prefix_id}}")
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    say("DONE")
    """
)


def kill_and_drain(proc, take) -> None:
    """SIGKILL the writer, then read what it said before it died (still in the pipe)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for line in proc.stdout:
        take(line)
    proc.stdout.close()


def kill_writer_mid_puts(data: str):
    """Run the writer, SIGKILL it as a put begins after 25 acknowledged ones; (begun, acked)."""
    script = WRITER.format(root=data_root(), tests=os.path.join(data_root(), "tests", "integration"), data=data)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    begun, acked, finished = set(), {}, []

    def take(line: str) -> None:
        kind, *rest = line.split()
        if kind == "BEGIN":
            begun.add(int(rest[0]))
        elif kind == "ACK":
            acked[int(rest[0])] = rest[1]
        elif kind == "DONE":
            finished.append(True)

    deadline = time.monotonic() + 120
    for line in proc.stdout:
        take(line)
        # killed just after a put began (not after an ack): that put is most likely still in flight
        if (len(acked) >= 25 and line.startswith("BEGIN")) or time.monotonic() > deadline:
            break
    kill_and_drain(proc, take)
    assert not finished, "the writer finished before it could be killed"
    assert len(acked) >= 25
    return begun, acked


def test_sigkill_during_concurrent_puts(tmp_path):
    # The writer's threads also spend time making inputs between puts; try
    # again (a fresh store) until the kill lands while a put is in flight.
    for attempt in range(5):
        data = str(tmp_path / f"data{attempt}")
        begun, acked = kill_writer_mid_puts(data)
        if begun - set(acked):
            break
    assert begun - set(acked), "no put was in flight when the writer was killed"

    ids = {chunk_hashes(prefix_inputs(i)[0], GEO, "", "")[-1].hex(): i for i in begun}
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        listed = {p["prefix_id"] for p in store.list_prefixes()}
        # every acknowledged prefix is listed ...
        assert set(acked.values()) <= listed
        # ... and nothing is listed that no put began (a put that committed but was
        # killed before its ACK line is complete, and is checked like the others)
        assert listed <= set(ids)
        for pid in listed:
            _, kv = prefix_inputs(ids[pid])
            np.testing.assert_array_equal(store.read(pid, range(GEO.num_chunks(TOKENS))).to_kv(), kv)
        assert all(r["ok"] for r in store.verify())
        # the files of puts in flight were reclaimed: every file belongs to a listed prefix
        referenced = {s["file"] for pid in listed for s in store.inspect(pid)["segments"]}
        assert set(os.listdir(store.segment_dir)) == referenced


# ------------------------------------------------------------ kill sweep over every step
SWEEP_GEO = StoreGeometry(ModelSpec(4, 2, 64, "float16"), chunk_tokens=16, group_layers=2)
SWEEP_OPS = 24


def sweep_inputs(i: int):
    """Prefix i of the sweep; odd ones share their first 2 of 5 chunks with
    prefix i-1, so deleting the even one leaves its segment 40% live: compacted."""
    tokens, kv = make_tokens(80, 100 + i), make_kv(SWEEP_GEO, 80, 100 + i)
    if i % 2:
        tokens[:32] = make_tokens(80, 99 + i)[:32]
        kv[:, :, :, :32] = make_kv(SWEEP_GEO, 80, 99 + i)[:, :, :, :32]
    return tokens, kv


def sweep_plan(seed: int) -> list[tuple[str, int]]:
    """A random mix of puts and deletes of stored prefixes.

    Each step is ``(operation, prefix)``; ``EXPECT`` says what an acknowledged
    step promises, so further store operations (eviction, compaction) join the
    sweep as one entry in each of ``EXPECT`` and the writer's ``OPS``.
    """
    rng = np.random.default_rng(seed)
    plan, stored = [], []
    for i in range(SWEEP_OPS):
        r = rng.random()
        if stored and r < 0.3:
            plan.append(("delete", stored.pop(int(rng.integers(len(stored))))))
        elif len(stored) > 3 and r < 0.4:  # evict down to about two prefixes' segments
            plan.append(("evict", 2))
        else:
            plan.append(("put", i))
            stored.append(i)
    return plan


# listed after an acknowledged step? (evict: the prefixes it names are not;
# while it runs, any stored prefix may go)
EXPECT = {"put": True, "delete": False, "evict": False}

SWEEP_WRITER = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{root!r}, {root!r} + "/tests", {tests!r}]
    from test_crash import SWEEP_GEO, sweep_inputs, sweep_plan
    from kvstore.config import StoreConfig
    from kvstore.contract.errors import NotFound
    from kvstore.contract.layout import SegmentLayout
    from kvstore.hashing import chunk_hashes
    from kvstore.store import ChunkStore

    def pid(i):
        return chunk_hashes(sweep_inputs(i)[0], SWEEP_GEO, "", "")[-1].hex()

    SEGMENT_BYTES = SegmentLayout(SWEEP_GEO, 80).total_bytes
    INDEX = {{pid(i): i for i in range({ops})}}

    def delete(store, i):
        try:
            store.delete(pid(i))
        except NotFound:  # an earlier eviction took it
            pass

    def evict(store, n):
        return [INDEX[p] for p in store.capacity.evict_to(n * SEGMENT_BYTES)["evicted"]]

    OPS = {{
        "put": lambda store, i: store.put(*sweep_inputs(i), SWEEP_GEO),
        "delete": delete,
        "evict": evict,
    }}
    store = ChunkStore(StoreConfig(data_dir={data!r}, min_free_bytes=0))
    print("OPEN", flush=True)
    for step, (op, i) in enumerate(sweep_plan({seed})):
        print("BEGIN", step, flush=True)
        out = OPS[op](store, i)
        if op == "evict":
            print("EVICTED", step, *out, flush=True)
        print("ACK", step, flush=True)
    print("DONE", flush=True)
    """
)


def run_and_kill(data: str, seed: int) -> tuple[set[int], set[int]]:
    """Run the sweep writer, SIGKILL it at a random point of a random step; (begun, acked) steps."""
    rng = np.random.default_rng(seed)
    kill_at, delay_s = int(rng.integers(SWEEP_OPS)), float(rng.uniform(0, 0.004))
    script = SWEEP_WRITER.format(
        root=data_root(), tests=os.path.join(data_root(), "tests", "integration"), data=data, seed=seed, ops=SWEEP_OPS
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    said = {"BEGIN": set(), "ACK": set(), "OPEN": set(), "DONE": set()}
    evicted: dict[int, list[int]] = {}

    def take(line: str) -> str:
        kind, *rest = line.split()
        if kind == "EVICTED":
            evicted[int(rest[0])] = [int(r) for r in rest[1:]]
        else:
            said[kind].update(int(r) for r in rest)
        return kind

    for line in proc.stdout:
        if take(line) == "BEGIN" and max(said["BEGIN"]) == kill_at:
            time.sleep(delay_s)  # a random point inside (or just after) the step
            break
    kill_and_drain(proc, take)
    return said["BEGIN"], said["ACK"], evicted


def sweep_pid(i: int) -> str:
    return chunk_hashes(sweep_inputs(i)[0], SWEEP_GEO, "", "")[-1].hex()


def check_after_kill(data: str, seed: int, begun: set[int], acked: set[int], evicted: dict[int, list[int]]) -> None:
    """Acknowledged steps hold; only a step in flight may have gone either way."""
    plan = sweep_plan(seed)
    must, may = {}, {}

    def expect(step: int, i: int, listed: bool) -> None:
        pid = sweep_pid(i)
        (must if step in acked else may)[pid] = (listed, i)
        if step not in acked:
            must.pop(pid, None)

    for step in sorted(begun):
        op, i = plan[step]
        if op != "evict":
            expect(step, i, EXPECT[op])
        elif step in acked:
            for j in evicted[step]:
                expect(step, j, EXPECT[op])
        else:  # killed while evicting: any stored prefix may be gone
            for pid, (on, j) in list(must.items()):
                if on:
                    expect(step, j, True)
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        listed = {p["prefix_id"] for p in store.list_prefixes()}
        assert {p for p, (on, _) in must.items() if on} <= listed
        assert not {p for p, (on, _) in must.items() if not on} & listed
        known = {p: i for p, (_, i) in {**must, **may}.items()}
        assert listed <= set(known), "a prefix no step wrote is listed"
        for pid in listed:
            kv = sweep_inputs(known[pid])[1]
            np.testing.assert_array_equal(store.read(pid, range(SWEEP_GEO.num_chunks(80))).to_kv(), kv)
        assert all(r["ok"] and not r["quarantined"] for r in store.verify())


def sweep(tmp_path, seeds) -> None:
    for seed in seeds:
        data = str(tmp_path / f"sweep{seed}")
        begun, acked, evicted = run_and_kill(data, seed)
        check_after_kill(data, seed, begun, acked, evicted)


def test_sigkill_at_random_steps_of_put_delete_evict_and_compact(tmp_path):
    sweep(tmp_path, range(10))


@pytest.mark.slow
def test_sigkill_at_random_steps_of_put_delete_evict_and_compact_many(tmp_path):
    sweep(tmp_path, range(100, 160))
