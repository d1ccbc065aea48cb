"""Every client call returns by its deadline whatever the daemon does, and a client
reaches a restarted daemon within a second (real daemons on unix sockets)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback

import grpc
import pytest
from helpers import make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract.geometry import ModelSpec, StoreGeometry

# 1024 tokens of 8 layers, 2 heads, head dim 64, float32: 8 MiB a read, long enough to be caught in flight
GEO = StoreGeometry(ModelSpec(8, 2, 64, "float32"), chunk_tokens=16, group_layers=2)
NUM_TOKENS = 1024
DEADLINE_S = 3.0
SLACK_S = 1.5  # a call returns no later than its deadline plus this
RECONNECT_S = 1.0


def _stored(daemon) -> str:
    with KVStoreClient(daemon.target, shm=False) as client:
        return client.put_prefix(make_tokens(NUM_TOKENS, 1), make_kv(GEO, NUM_TOKENS, 1), GEO).prefix_id


class _Readers:
    """Threads reading a prefix over and over, each call timed; anything but a result or KVStoreRpcError is kept as a failure."""

    def __init__(self, client: KVStoreClient, prefix_id: str, num_threads: int):
        self.client, self.prefix_id = client, prefix_id
        self.stop = threading.Event()
        self.calls: list[tuple[float, str]] = []  # (seconds it took, outcome)
        self.failures: list[Exception] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(num_threads)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.client.read_chunks(self.prefix_id, range(NUM_TOKENS // 16), timeout=DEADLINE_S).release()
                outcome = "ok"
            except KVStoreRpcError as exc:
                outcome = exc.code.name
            except Exception as exc:  # reported by the test
                self.failures.append(exc)
                return
            self.calls.append((time.monotonic() - t0, outcome))

    def finish(self) -> list[threading.Thread]:
        """Stop starting calls; the threads still blocked once every call's deadline and slack have passed."""
        self.stop.set()
        end = time.monotonic() + DEADLINE_S + SLACK_S
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return [t for t in self.threads if t.is_alive()]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "sig, shm", [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGKILL, False)], ids=["term", "term-shm", "kill"]
)
def test_reads_in_flight_return_by_their_deadline_when_the_daemon_stops(daemon, sig, shm):
    prefix_id = _stored(daemon)
    with KVStoreClient(daemon.target, shm=shm) as client:
        readers = _Readers(client, prefix_id, 6)
        time.sleep(0.5)  # reads in flight
        daemon.proc.send_signal(sig)
        daemon.proc.wait(20)
        time.sleep(0.5)  # and calls on a daemon that is gone
        hung = readers.finish()
        assert not readers.failures, readers.failures
        stacks = ["".join(traceback.format_stack(sys._current_frames()[t.ident])) for t in hung]
        assert not hung, f"{len(hung)} readers still blocked {DEADLINE_S + SLACK_S} s after the last call began:\n" + "\n".join(stacks)
        assert readers.calls
        late = [c for c in readers.calls if c[0] > DEADLINE_S + SLACK_S]
        assert not late, late
        assert {outcome for _, outcome in readers.calls} - {"ok"}  # the stop was seen


def _first_success_s(client: KVStoreClient, limit_s: float = 10.0) -> float:
    """Seconds until ``client.stats`` succeeds, polling with short deadlines."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            client.stats(timeout=0.2)
            return time.monotonic() - t0
        except KVStoreRpcError:
            time.sleep(0.01)
    return float("inf")


@pytest.mark.timeout(30)
def test_a_restarted_daemon_is_reached_within_a_second_by_the_same_and_a_new_client(daemon):
    prefix_id = _stored(daemon)
    with KVStoreClient(daemon.target) as client:
        assert client.shm
        client.read_chunks(prefix_id, [0, 1]).release()
        stale_session = client.session_id
        daemon.stop()
        t_down = time.monotonic()
        while time.monotonic() - t_down < 3.0:  # calls fail meanwhile: the channel backs off
            with pytest.raises(KVStoreRpcError) as err:
                client.stats(timeout=0.5)
            assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            time.sleep(0.1)
        daemon.start()
        assert _first_success_s(client) < RECONNECT_S
        with KVStoreClient(daemon.target, shm=False) as fresh:
            assert _first_success_s(fresh) < RECONNECT_S
        # the restarted daemon knows nothing of the old shm session: the read opens a new one
        read = client.read_chunks(prefix_id, [0, 1], timeout=5)
        read.release()
        assert client.session_id not in (0, stale_session)
        assert read.chunks.tolist() == [0, 1]


@pytest.mark.timeout(30)
def test_a_read_on_a_session_the_daemon_closed_opens_a_new_session(daemon):
    prefix_id = _stored(daemon)
    with KVStoreClient(daemon.target) as client:
        closed = client.session_id
        client.session.close()
        deadline = time.monotonic() + 10
        while client.stats().shm_sessions and time.monotonic() < deadline:  # the daemon has seen it go
            time.sleep(0.02)
        read = client.read_chunks(prefix_id, [0], timeout=5)  # FAILED_PRECONDITION at first, then the new session
        assert read.zero_copy
        assert (read.extent(0, 0) == make_kv(GEO, NUM_TOKENS, 1)[0:2, :, :, 0:16]).all()
        read.release()
        assert client.session_id not in (0, closed)


@pytest.fixture
def stalled_socket(tmp_path):
    """A unix socket that accepts connections and never answers."""
    path = str(tmp_path / "stalled.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"unix:{path}"
    server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(5)
    for conn in held:
        conn.close()
    os.unlink(path)


@pytest.mark.timeout(30)
def test_calls_on_a_stalled_socket_end_by_their_deadline(stalled_socket):
    with KVStoreClient(stalled_socket, shm=False) as client:
        for name, fn in (
            ("stats", lambda: client.stats(timeout=1.0)),
            ("read_chunks", lambda: client.read_chunks("ab" * 32, [0], timeout=1.0)),
            ("get_summaries", lambda: client.get_summaries("ab" * 32, timeout=1.0)),
        ):
            t0 = time.monotonic()
            with pytest.raises(KVStoreRpcError) as err:
                fn()
            took = time.monotonic() - t0
            assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, name
            assert took <= 1.0 + SLACK_S, (name, took)
