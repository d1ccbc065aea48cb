"""One client cannot touch what another holds, and hostile input changes nothing.

Real daemon, real arena, a second client in its own process where the
boundary is between processes.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from helpers import GEOMETRIES, data_root, make_kv, make_tokens, settled

from engine_client.client import KVStoreClient
from kvstore.contract import geometry_to_pb, pb, rpc

GEO24 = GEOMETRIES[3]  # 24 layers in groups of 8: 3 periods of one group

ATTACKER = """
import json, secrets, struct, sys
import grpc, numpy as np
from engine_client.client import KVStoreClient
from kvstore.contract import pb

target, victim_leases, other_pid = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
codes = {}
with KVStoreClient(target) as b:
    def release(name, session, ids):
        try:
            codes[name] = ["OK", b.stub.Release(pb.ReleaseRequest(shm_session=session, lease_ids=ids), timeout=10).released]
        except grpc.RpcError as exc:
            codes[name] = [exc.code().name, exc.details()]
    guessed = list(range(1, 2001))
    release("session 0, ids 1..N", 0, guessed)
    release("own session, ids 1..N", b.session_id, guessed)
    release("own session, the victim's ids", b.session_id, victim_leases)
    release("a guessed session", secrets.randbits(63) or 1, victim_leases)
    b.session.sock.sendall(struct.pack(f"<{len(victim_leases)}Q", *victim_leases))  # on its own shm connection
    b.session.sock.sendall(struct.pack(f"<{len(guessed)}Q", *guessed))
    for _ in range(3):  # reuse whatever was freed: read another prefix into the arena
        with b.prefetch(other_pid, period_layers=8, shm=False) as st:
            for p in range(st.num_periods):
                st.send(p, np.arange(32))
                list(st.groups(p))
print(json.dumps(codes), flush=True)
"""


def _attack(daemon, victim_leases, other_pid) -> dict:
    env = {**os.environ, "PYTHONPATH": data_root()}
    out = subprocess.run(
        [sys.executable, "-c", ATTACKER, daemon.target, json.dumps(victim_leases), other_pid],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_another_client_cannot_release_a_streams_or_a_sessions_leases(daemon_factory):
    # no CPU tier: every extent a stream or a read hands out lives in a leased buffer
    d = daemon_factory("--prefetch-reserve-fraction", "1.0")
    n = 512
    kv, other_kv = make_kv(GEO24, n, 1), make_kv(GEO24, n, 2)
    with KVStoreClient(d.target) as a:
        pid = a.put_prefix(make_tokens(n, 1), kv, GEO24).prefix_id
        other_pid = a.put_prefix(make_tokens(n, 2), other_kv, GEO24).prefix_id
        chunks = np.arange(32)
        st = a.prefetch(pid, period_layers=8, speculate=False)
        st.send(0, chunks)
        streamed = st.group_kv(0)  # zero-copy: a view into the stream's leased buffer
        raw = list(a.stub.ReadChunks(pb.ReadChunksRequest(prefix_id=pid, chunks=[0, 1, 2], shm_session=a.session_id), timeout=30))
        held = sorted({ref.lease_id for msg in raw if msg.HasField("shm_group") for ref in msg.shm_group.refs})
        leased = a.stats().shm_leased_bytes
        assert held and leased > 0

        codes = _attack(d, held, other_pid)

        assert codes["session 0, ids 1..N"][0] == "INVALID_ARGUMENT" and "shm_session" in codes["session 0, ids 1..N"][1]
        for name in ("own session, ids 1..N", "own session, the victim's ids"):
            assert codes[name][0] == "NOT_FOUND" and "nothing was released" in codes[name][1], codes
        assert codes["a guessed session"][0] == "INVALID_ARGUMENT", codes
        assert a.stats().shm_leased_bytes == leased  # nothing of A's was freed
        np.testing.assert_array_equal(streamed, kv[0:8])  # A's view still holds A's bytes
        assert a.stub.Release(pb.ReleaseRequest(shm_session=a.session_id, lease_ids=held), timeout=10).released == len(held)
        st.close()
    with KVStoreClient(d.target) as check:
        s = settled(check)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0


def _rpc_methods():
    for service in rpc.SERVICES:
        for m in service.methods:
            yield f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming


def _raw_call(channel, path: str, client_streaming: bool, server_streaming: bool, body: bytes):
    """Send ``body`` as the request bytes of ``path`` (no serializer) and read every response."""
    if client_streaming and server_streaming:
        return list(channel.stream_stream(path)(iter([body]), timeout=10))
    if client_streaming:
        return channel.stream_unary(path)(iter([body]), timeout=10)
    if server_streaming:
        return list(channel.unary_stream(path)(body, timeout=10))
    return channel.unary_unary(path)(body, timeout=10)


def test_a_body_that_does_not_parse_is_invalid_argument_for_every_rpc(daemon):
    methods = list(_rpc_methods())
    with grpc.insecure_channel(daemon.target) as channel:
        for path, client_streaming, server_streaming in methods:
            try:
                _raw_call(channel, path, client_streaming, server_streaming, b"\xff" * 7)
                raise AssertionError(f"{path} accepted a body that does not parse")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, exc.code(), exc.details())
                assert "request: body of 7 bytes does not parse" in exc.details(), exc.details()
    log = daemon.log()
    assert "Traceback" not in log
    assert log.count("does not parse") == len(methods)  # one line each


def test_sigterm_with_a_finished_and_an_open_prefetch_stream_exits_0(daemon_factory):
    d = daemon_factory("--grace-seconds", "1")
    n = 256
    client = KVStoreClient(d.target)
    pid = client.put_prefix(make_tokens(n, 1), make_kv(GEO24, n, 1), GEO24).prefix_id
    with client.prefetch(pid, period_layers=8) as done:
        for p in range(done.num_periods):
            done.send(p, [0, 1, 2])
            list(done.groups(p))
    left_open = client.prefetch(pid, period_layers=8)
    left_open.send(0, [0, 1, 2])
    left_open.group_kv(0)
    assert d.stop(signal.SIGTERM) == 0, d.log()
    log = d.log()
    assert "cancelling them" in log and "stopped" in log and "Traceback" not in log
    client.close()


def _open_shm(path: str):
    """Connect to the shm side channel: (hello line, received fds)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        msg, fds, _, _ = socket.recv_fds(sock, 4096, 1)
    for fd in fds:
        os.close(fd)
    return json.loads(msg.decode()), fds


def test_shm_peer_outside_the_allow_list_gets_no_descriptor(daemon_factory):
    assert os.getuid() != 4242 and os.getgid() != 4242
    d = daemon_factory("--shm-allowed-uids", "4242", "--shm-allowed-gids", "4242,4243")
    hello, fds = _open_shm(d.socket + ".shm")
    assert fds == [] and "session" not in hello
    assert "shm_allowed_uids" in hello["error"]
    assert "shm session refused" in d.log()
    with KVStoreClient(d.target, shm=False) as client:
        assert client.stats().shm_sessions == 0  # the gRPC socket still serves
    with pytest.raises(ConnectionError, match="shm_allowed_uids"):  # asked for shm: the daemon's reason
        KVStoreClient(d.target, shm=True)
    with KVStoreClient(d.target) as client:  # shm if it can: refused, it reads bytes in the stream
        assert not client.shm
        geo = GEOMETRIES[0]
        pid = client.put_prefix(make_tokens(40, 1), make_kv(geo, 40, 1), geo).prefix_id
        with client.read_chunks(pid, [0, 1, 2]) as got:
            np.testing.assert_array_equal(got.to_kv(), make_kv(geo, 40, 1))


def test_shm_sessions_are_bounded_and_idle_ones_cost_no_thread(daemon_factory):
    d = daemon_factory("--max-shm-sessions", "40")

    def threads() -> int:
        with open(f"/proc/{d.proc.pid}/status") as fh:
            return int(next(line for line in fh if line.startswith("Threads:")).split()[1])

    with KVStoreClient(d.target, shm=False) as client:
        client.stats()
        before = threads()
        socks = []
        for _ in range(40):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(d.socket + ".shm")
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            assert len(fds) == 1 and "session" in json.loads(msg)
            os.close(fds[0])
            socks.append(sock)
        assert client.stats().shm_sessions == 40
        assert threads() <= before + 2  # not one per session
        hello, fds = _open_shm(d.socket + ".shm")
        assert fds == [] and "max_shm_sessions (40)" in hello["error"]
        socks.pop().close()
        deadline = time.monotonic() + 15
        while client.stats().shm_sessions != 39 and time.monotonic() < deadline:
            time.sleep(0.02)
        hello, fds = _open_shm(d.socket + ".shm")  # room again: admitted (and closed at once)
        assert len(fds) == 1 and "session" in hello
        for sock in socks:
            sock.close()


def _files(root: str) -> set:
    return {os.path.join(p, f) for p, _, names in os.walk(root) for f in names if not f.endswith((".mdb", ".lock"))}


def test_a_put_that_stalls_after_its_header_is_aborted_and_frees_its_reservation(daemon_factory):
    d = daemon_factory("--put-idle-seconds", "0.5")
    before = _files(d.data_dir)
    header = pb.PutHeader(geometry=geometry_to_pb(GEO24), tokens=make_tokens(256, 1).tolist())
    hold = threading.Event()

    def frames():
        yield pb.PutPrefixRequest(header=header)
        hold.wait(30)  # the client stays connected and sends nothing

    with KVStoreClient(d.target, shm=False) as client:
        try:
            client.stub.PutPrefix(frames(), timeout=30)
            raise AssertionError("a stalled put was not aborted")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "put_idle_seconds" in exc.details()
        finally:
            hold.set()
        assert _files(d.data_dir) == before  # the reserved segment file is gone
        assert client.put_prefix(make_tokens(256, 1), make_kv(GEO24, 256, 1), GEO24).num_chunks == 16
