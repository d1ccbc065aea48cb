"""SIGKILL in the middle of many concurrent puts loses nothing acknowledged."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
from helpers import data_root, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.geometry import ModelSpec, StoreGeometry
from kvstore.hashing import chunk_hashes
from kvstore.store import ChunkStore

GEO = StoreGeometry(ModelSpec(24, 2, 64, "bfloat16"), chunk_tokens=16, period_layers=8)
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


def kill_writer_mid_puts(data: str):
    """Run the writer, SIGKILL it after 25 acknowledged puts; (begun, acked)."""
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
        if len(acked) >= 25 or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for line in proc.stdout:  # what the writer said before it died is still in the pipe
        take(line)
    proc.stdout.close()
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
