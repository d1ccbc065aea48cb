"""The client's error type and retries, against real daemons."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from helpers import make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract import geometry_to_pb, pb
from kvstore.contract import rpc as pb_grpc
from kvstore.contract.geometry import ModelSpec, StoreGeometry

GEO = StoreGeometry(ModelSpec(2, 1, 8, "float32"), chunk_tokens=16, group_layers=2)
UNKNOWN = "ab" * 32


def test_streamed_reads_of_an_unknown_prefix_raise_not_found(daemon):
    with KVStoreClient(daemon.target) as client:
        for call in (lambda: client.get_summaries(UNKNOWN), lambda: client.get_probe_keys(UNKNOWN, 0)):
            with pytest.raises(KVStoreRpcError) as err:
                call()
            assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_a_call_during_drain_surfaces_unavailable_as_the_client_error(daemon):
    kv, tokens = make_kv(GEO, 64, 1), make_tokens(64, 1)
    go_on = threading.Event()

    def frames():  # holds the daemon in its drain until released
        yield pb.PutPrefixRequest(header=pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=tokens.tolist()))
        go_on.wait(20)
        for j in range(4):
            data = np.ascontiguousarray(kv[:, :, :, j * 16 : (j + 1) * 16]).tobytes()
            yield pb.PutPrefixRequest(extent=pb.ExtentFrame(group=0, chunk=j, offset=0, data=data))

    with KVStoreClient(daemon.target, shm=False) as client:
        call = client.stub.PutPrefix.future(frames(), timeout=60)
        client.stats()  # the daemon is up and the put is admitted before the signal
        daemon.proc.send_signal(15)
        code = None
        for _ in range(200):
            try:
                client.get_summaries(UNKNOWN, timeout=5)
            except KVStoreRpcError as exc:
                code = exc.code
                if code == grpc.StatusCode.UNAVAILABLE:
                    break
        go_on.set()
        assert code == grpc.StatusCode.UNAVAILABLE
        assert call.result(timeout=30).num_chunks == 4
    assert daemon.proc.wait(30) == 0


class _Flaky(pb_grpc.KVStoreServicer):
    """Answers Stats UNAVAILABLE twice, then OK: makes the client's retries countable."""

    def __init__(self):
        self.attempts = 0

    def Stats(self, request, context):
        self.attempts += 1
        if self.attempts <= 2:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")
        return pb.StatsResponse(num_prefixes=7)


@pytest.fixture
def serve(tmp_path):
    """``serve(servicer)``: an in-process KVStore server on a unix socket; its target."""
    servers = []

    def start(servicer) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_KVStoreServicer_to_server(servicer, server)
        target = f"unix:{tmp_path}/s{len(servers)}.sock"
        server.add_insecure_port(target)
        server.start()
        servers.append(server)
        return target

    yield start
    for server in servers:
        server.stop(0)


def test_unavailable_is_retried_with_backoff_by_the_client(serve):
    flaky = _Flaky()
    with KVStoreClient(serve(flaky), shm=False) as client:
        assert client.stats(timeout=10).num_prefixes == 7
    assert flaky.attempts == 3


class _FlakyStream(pb_grpc.KVStoreServicer):
    """GetSummaries: UNAVAILABLE ``failures`` times, then one frame, then UNAVAILABLE if ``fail_after_frame``."""

    def __init__(self, failures: int, fail_after_frame: bool):
        self.failures, self.fail_after_frame = failures, fail_after_frame
        self.attempts = 0

    def GetSummaries(self, request, context):
        self.attempts += 1
        if self.attempts <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")
        yield pb.GetSummariesResponse(
            frame=pb.ArrayFrame(shape=[2], dtype="float32", offset=0, data=np.arange(2, dtype=np.float32).tobytes())
        )
        if self.fail_after_frame:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")

    def Stats(self, request, context):
        self.attempts += 1
        context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")


def test_a_stream_is_retried_until_its_first_message(serve):
    flaky = _FlakyStream(failures=2, fail_after_frame=False)
    with KVStoreClient(serve(flaky), shm=False) as client:
        assert client.get_summaries(UNKNOWN, timeout=10).tolist() == [0.0, 1.0]
    assert flaky.attempts == 3


def test_a_stream_that_failed_after_a_message_is_not_retried(serve):
    flaky = _FlakyStream(failures=0, fail_after_frame=True)
    with KVStoreClient(serve(flaky), shm=False) as client:
        with pytest.raises(KVStoreRpcError) as err:
            client.get_summaries(UNKNOWN, timeout=10)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert flaky.attempts == 1


@pytest.mark.timeout(30)
def test_retries_stop_at_the_deadline(serve):
    flaky = _FlakyStream(failures=10**6, fail_after_frame=False)
    with KVStoreClient(serve(flaky), shm=False) as client:
        for fn in (lambda: client.stats(timeout=0.05), lambda: client.get_summaries(UNKNOWN, timeout=0.05)):
            t0 = time.monotonic()
            with pytest.raises(KVStoreRpcError) as err:
                fn()
            assert time.monotonic() - t0 < 0.05 + 0.5
            assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        flaky.attempts = 0
        with pytest.raises(KVStoreRpcError) as err:
            client.stats(timeout=30)  # time for every attempt: five, then the last failure
        assert err.value.code == grpc.StatusCode.UNAVAILABLE and flaky.attempts == 5


class _SlowReader(pb_grpc.KVStoreServicer):
    """Takes a put's frames one every ``pause_s``: a daemon on starved cores, made repeatable."""

    def __init__(self, pause_s: float):
        self.pause_s = pause_s

    def Lookup(self, request, context):
        return pb.LookupResponse()

    def PutPrefix(self, request_iterator, context):
        chunks = 0
        for req in request_iterator:
            time.sleep(self.pause_s)
            chunks += req.HasField("extent")
        return pb.PutPrefixResponse(num_chunks=chunks)


def test_a_puts_deadline_grows_with_its_payload_at_the_floor_rate(tmp_path):
    kv, tokens = make_kv(GEO, 64, 1), make_tokens(64, 1)  # 4 extents after the header: >= 1 s at 0.2 s a frame
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_KVStoreServicer_to_server(_SlowReader(0.2), server)
    server.add_insecure_port(f"unix:{tmp_path}/s.sock")
    server.start()
    target = f"unix:{tmp_path}/s.sock"
    try:
        # 0.4 s for any call, plus the payload at kv.nbytes / 5 bytes a second: 5.4 s for the put
        with KVStoreClient(target, shm=False, deadline_s=0.4, put_floor_bytes_s=kv.nbytes / 5) as client:
            assert client.put_prefix(tokens, kv, GEO).num_chunks == 4
            with pytest.raises(KVStoreRpcError) as err:  # an explicit timeout is the whole deadline
                client.put_prefix(tokens, kv, GEO, timeout=0.4)
            assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        with KVStoreClient(target, shm=False, deadline_s=0.4, put_floor_bytes_s=1e15) as client:  # no allowance
            with pytest.raises(KVStoreRpcError) as err:
                client.put_prefix(tokens, kv, GEO)
            assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        server.stop(0)


@pytest.mark.parametrize("field, value", [("deadline_s", 0), ("deadline_s", -1.0), ("put_floor_bytes_s", float("nan"))])
def test_a_deadline_that_is_not_a_positive_number_is_refused(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be a positive number, got"):
        KVStoreClient("unix:/nonexistent.sock", shm=False, **{field: value})
