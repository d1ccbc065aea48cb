"""Fuzz every RPC of a real daemon with hostile-but-valid messages and raw bytes.

Messages are generated from the protobuf descriptors, so a field added to the
API is fuzzed without touching this file.  Values lean towards the edges
(zero, type limits, stored prefix ids, the stored geometry) so that requests
get past the first check and into the handlers.  Every call must end with a
status code the API documents for bad input (pages: ``NEAR_VALID_CALLS``
sends puts, reads and existence checks of pages it stored); afterwards the daemon is alive,
its log holds no traceback, no lease or pin is left, and the stored prefixes
read back byte-exact.

The default run is bounded (derandomized, a few dozen examples per method);
``pytest -m slow`` runs a larger, randomized sweep.
"""

import os

import grpc
import numpy as np
import pytest
from daemon import DaemonProcess
from google.protobuf.descriptor import FieldDescriptor
from helpers import GEOMETRIES, make_kv, make_tokens, settled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pages import make_pages, page_keys

from engine_client.client import KVStoreClient
from kvstore.contract import geometry_to_pb, pb, rpc

GEO = GEOMETRIES[0]  # 5 layers, 1 head, head dim 1: small extents, 3 groups
PAGE_KEYS = page_keys(6, 11)  # pages stored before each method is fuzzed; the fuzzer knows their keys
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
}
CALL_TIMEOUT_S = 10.0

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}
_EDGES = [0, 1, 2, 3, 5, 7, 15, 16, 17, 31, 255, 4096, 2**31 - 1, 2**32 - 1, 2**63 - 1, -1, -(2**63)]


class Fuzzer:
    """Strategies for the daemon's request messages, seeded with its real state."""

    def __init__(self, prefix_ids: list[str], geometry_pb, shm_session: int):
        self.prefix_ids = prefix_ids
        self.geometry_pb = geometry_pb
        self.shm_session = shm_session

    def string(self, name: str):
        if name == "prefix_id":
            stored = st.sampled_from(self.prefix_ids)
            hostile = st.one_of(stored.map(lambda p: p[:8]), stored.map(lambda p: p.upper()), st.text(max_size=70))
            return st.one_of(stored, stored, stored, hostile)
        if name == "dtype":
            return st.one_of(st.sampled_from(["bfloat16", "float16", "float32", "int8", ""]), st.text(max_size=12))
        return st.one_of(st.just(""), st.text(max_size=24))

    def scalar(self, f: FieldDescriptor):
        t = f.type
        if t in _INT_RANGES:
            lo, hi = _INT_RANGES[t]
            return st.one_of(st.sampled_from([v for v in _EDGES if lo <= v <= hi]), st.integers(lo, hi), st.integers(0, 40))
        if t == FieldDescriptor.TYPE_BOOL:
            return st.booleans()
        if t == FieldDescriptor.TYPE_FLOAT:
            return st.floats(width=32)
        if t == FieldDescriptor.TYPE_DOUBLE:
            return st.floats()
        if t == FieldDescriptor.TYPE_STRING:
            return self.string(f.name)
        if t == FieldDescriptor.TYPE_BYTES:
            return st.binary(max_size=64)
        raise AssertionError(f"no strategy for {f.full_name} (type {t})")

    def field(self, f: FieldDescriptor, depth: int):
        if f.name == "shm_session":  # this fuzzer's own session, none, or another
            return st.one_of(st.just(self.shm_session), st.just(0), self._generic_field(f, depth))
        near = NEAR_VALID.get(f.name)
        if near is not None and f.type != FieldDescriptor.TYPE_MESSAGE:
            return st.one_of(near, near, self._generic_field(f, depth))
        return self._generic_field(f, depth)

    def _generic_field(self, f: FieldDescriptor, depth: int):
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            one = self.message(f.message_type, depth + 1)
        else:
            one = self.scalar(f)
        if f.is_repeated:
            return st.lists(one, max_size=48 if f.name == "tokens" else 6)
        return one

    def message(self, desc, depth: int = 0):
        if desc.full_name == "kvstore.v1.Geometry":
            real = st.just(self.geometry_pb)
            if depth > 2:
                return real
            return st.one_of(real, self._fields(desc, depth))
        if depth > 3:
            return st.just(_cls(desc)())
        return self._fields(desc, depth)

    def _fields(self, desc, depth: int):
        optional = {f.name: self.field(f, depth) for f in desc.fields}
        return st.fixed_dictionaries({}, optional=optional).map(lambda kw: _build(desc, kw))


# Values that pass the first checks of the handlers, so later code is reached.
NEAR_VALID = {
    "chunks": st.lists(st.integers(0, 8), unique=True, max_size=8),
    "attention": st.lists(st.floats(0, 2), max_size=8),
    "group": st.integers(0, 3),
    "period": st.integers(0, 3),
    "layer_start": st.integers(0, 6),
    "layer_end": st.integers(0, 6),
    "period_layers": st.sampled_from([0, 2, 4, 6]),
    "group_layers": st.sampled_from([0, 2, 4, 6]),
    "lease_ids": st.lists(st.integers(0, 64), max_size=8),
    "covered_groups": st.lists(st.integers(0, 3), max_size=3),
    "tokens": st.lists(st.integers(0, 50_000), min_size=1, max_size=48),
    "keys": st.lists(st.one_of(st.sampled_from(PAGE_KEYS), st.binary(min_size=1, max_size=64)), max_size=8),
    "skip_pages": st.lists(st.integers(0, 8), max_size=3),
}


def _cls(desc):
    return getattr(pb, desc.name)


def _build(desc, kw: dict):
    msg = _cls(desc)()
    for name, value in kw.items():
        f = desc.fields_by_name[name]
        if f.is_repeated:
            getattr(msg, name).extend(value)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


def _methods():
    for service in rpc.SERVICES:
        for m in service.methods:
            yield service, m


METHODS = list(_methods())


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    # a fuzzed session that never releases fills the arena: its next read must
    # get RESOURCE_EXHAUSTED well within the call's deadline
    d = DaemonProcess(str(tmp_path_factory.mktemp("fuzz") / "data"), "--lease-wait-seconds", "1").start()
    yield d
    d.cleanup()


def _store_prefixes(d, seeds) -> dict:
    """Put (again: a put of a stored prefix is a no-op) one prefix per seed."""
    stored = {}
    with KVStoreClient(d.target) as client:
        for seed in seeds:
            kv, tokens = make_kv(GEO, 100, seed), make_tokens(100, seed)
            stored[client.put_prefix(tokens, kv, GEO).prefix_id] = kv
    return stored


def _call(channel, service, method, payload_messages, *, raw: bool):
    """Invoke ``method`` with request messages (or raw byte strings)."""
    path = f"/{service.full_name}/{method.name}"
    ser = (lambda b: b) if raw else (lambda m: m.SerializeToString())
    de = lambda b: b  # noqa: E731 - responses are not inspected
    kind = (method.client_streaming, method.server_streaming)
    try:
        if kind == (False, False):
            channel.unary_unary(path, ser, de)(payload_messages[0], timeout=CALL_TIMEOUT_S)
        elif kind == (False, True):
            list(channel.unary_stream(path, ser, de)(payload_messages[0], timeout=CALL_TIMEOUT_S))
        elif kind == (True, False):
            channel.stream_unary(path, ser, de)(iter(payload_messages), timeout=CALL_TIMEOUT_S)
        else:
            list(channel.stream_stream(path, ser, de)(iter(payload_messages), timeout=CALL_TIMEOUT_S))
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def _requests(fuzzer: Fuzzer, method):
    one = fuzzer.message(method.input_type)
    generic = st.lists(one, min_size=1, max_size=4) if method.client_streaming else one.map(lambda m: [m])
    near = NEAR_VALID_CALLS.get(method.name)
    return generic if near is None else st.one_of(generic, near(fuzzer))


NUM_CHUNKS = GEO.num_chunks(100)  # every stored prefix has 100 tokens
some_chunks = st.lists(st.integers(0, NUM_CHUNKS - 1), unique=True, min_size=1, max_size=NUM_CHUNKS)
stored_layers = st.integers(0, GEO.model.num_layers)


def _maybe_flag(draw, name: str) -> dict:
    """A default-on option: unset, on or off (and the older negated flag drawn beside it)."""
    value = draw(st.sampled_from([None, True, False]))
    return {} if value is None else {name: value}


@st.composite
def _read_chunks(draw, fuzzer: Fuzzer):
    start = draw(stored_layers)
    return [
        pb.ReadChunksRequest(
            prefix_id=draw(st.sampled_from(fuzzer.prefix_ids)),
            chunks=draw(some_chunks),
            layer_start=start,
            layer_end=draw(st.sampled_from([0, start + 1, GEO.model.num_layers])),
            no_coalesce=draw(st.booleans()),
            **_maybe_flag(draw, "coalesce"),
            shm_session=draw(st.sampled_from([0, fuzzer.shm_session])),
        )
    ]


@st.composite
def _report_attention(draw, fuzzer: Fuzzer):
    chunks = draw(some_chunks)
    mass = st.one_of(st.floats(0, 10), st.sampled_from([float("nan"), float("inf"), -1.0]))
    return [
        pb.ReportAttentionRequest(
            prefix_id=draw(st.sampled_from(fuzzer.prefix_ids)),
            group=draw(st.integers(0, GEO.num_groups)),
            chunks=chunks,
            attention=draw(st.lists(mass, min_size=len(chunks), max_size=len(chunks))),
        )
    ]


@st.composite
def _put_sequences(draw, fuzzer: Fuzzer):
    """A header for a new prefix, then its extent frames, a few of them wrong."""
    num_tokens = draw(st.integers(1, 40))
    tokens = draw(st.lists(st.integers(0, 50_000), min_size=num_tokens, max_size=num_tokens))
    msgs = [pb.PutPrefixRequest(header=pb.PutHeader(geometry=fuzzer.geometry_pb, tokens=tokens))]
    c = GEO.chunk_tokens
    frames = []
    for g in range(GEO.num_groups):
        for j in range(GEO.num_chunks(num_tokens)):
            size = int(np.prod(GEO.extent_shape(g, min(c, num_tokens - j * c)))) * 2
            frames.append(pb.ExtentFrame(group=g, chunk=j, data=draw(st.binary(min_size=size, max_size=size))))
    frames = draw(st.permutations(frames))
    for _ in range(draw(st.integers(0, 2))):  # damage: drop, repeat, resize or move a frame
        i = draw(st.integers(0, len(frames) - 1))
        damage = draw(st.sampled_from(["drop", "repeat", "short", "offset", "group", "chunk"]))
        f = pb.ExtentFrame()
        f.CopyFrom(frames[i])
        if damage == "drop":
            del frames[i]
            continue
        if damage == "short":
            f.data = f.data[:-2]
        elif damage == "offset":
            f.offset = draw(st.sampled_from([1, 2**40, 2**64 - 1]))
        elif damage == "group":
            f.group = draw(st.sampled_from([GEO.num_groups, 2**32 - 1]))
        elif damage == "chunk":
            f.chunk = draw(st.sampled_from([GEO.num_chunks(num_tokens), 2**32 - 1]))
        frames.insert(i, f)
    return msgs + [pb.PutPrefixRequest(extent=f) for f in frames]


@st.composite
def _prefetch_sequences(draw, fuzzer: Fuzzer):
    """An open for a stored prefix, then period sets and hints in (mostly) order."""
    period_layers = draw(st.sampled_from([2, 4, 6, 3, 0]))
    open_ = pb.PrefetchOpen(
        prefix_id=draw(st.sampled_from(fuzzer.prefix_ids)),
        period_layers=period_layers,
        no_speculation=draw(st.booleans()),
        no_coalesce=draw(st.booleans()),
        **_maybe_flag(draw, "speculation"),
        **_maybe_flag(draw, "coalesce"),
        hints=draw(st.booleans()),
        shm_session=draw(st.sampled_from([0, fuzzer.shm_session])),
    )
    open_.push_speculation = bool(open_.shm_session) and draw(st.booleans())
    msgs = [pb.PrefetchRequest(open=open_)]
    num_periods = -(-GEO.model.num_layers // period_layers) if period_layers else 1
    for p in range(draw(st.integers(0, num_periods + 1))):
        if draw(st.booleans()):
            hint = pb.PeriodHint(period=p + draw(st.sampled_from([1, 1, 0, 2])), chunks=draw(some_chunks))
            msgs.append(pb.PrefetchRequest(hint=hint))
        covered = draw(st.lists(st.integers(0, 3), max_size=1))
        msgs.append(pb.PrefetchRequest(period=pb.PeriodSet(period=p, chunks=draw(some_chunks), covered_groups=covered)))
    return msgs


@st.composite
def _put_pages_sequences(draw, fuzzer: Fuzzer):
    """A header naming stored and new pages, some skipped, then their frames, a few of them wrong."""
    keys = draw(st.lists(st.one_of(st.sampled_from(PAGE_KEYS), st.binary(min_size=1, max_size=64)), min_size=1, max_size=5, unique=True))
    skip = [i for i, k in enumerate(keys) if k in PAGE_KEYS and draw(st.booleans())]
    msgs = [pb.PutPagesRequest(header=pb.PutPagesHeader(geometry=fuzzer.geometry_pb, keys=keys, skip_pages=skip))]
    frames = []
    for g in range(GEO.num_groups):
        size = GEO.extent_bytes(g, GEO.chunk_tokens)
        for i in range(len(keys)):
            if i not in skip:
                frames.append(pb.ExtentFrame(group=g, chunk=i, data=draw(st.binary(min_size=size, max_size=size))))
    frames = draw(st.permutations(frames))
    for _ in range(draw(st.integers(0, 2))) if frames else ():
        i = draw(st.integers(0, len(frames) - 1))
        f = pb.ExtentFrame()
        f.CopyFrom(frames[i])
        damage = draw(st.sampled_from(["drop", "repeat", "short", "offset", "chunk"]))
        if damage == "drop":
            del frames[i]
            continue
        if damage == "short":
            f.data = f.data[:-2]
        elif damage == "offset":
            f.offset = draw(st.sampled_from([1, 2**40, 2**64 - 1]))
        elif damage == "chunk":
            f.chunk = draw(st.sampled_from([len(keys), 2**32 - 1, *skip]))
        frames.insert(i, f)
    return msgs + [pb.PutPagesRequest(extent=f) for f in frames]


@st.composite
def _get_pages(draw, fuzzer: Fuzzer):
    start = draw(stored_layers)
    keys = draw(st.lists(st.sampled_from(PAGE_KEYS), min_size=1, max_size=6, unique=True))
    return [
        pb.GetPagesRequest(
            geometry=fuzzer.geometry_pb,
            keys=keys,
            layer_start=start,
            layer_end=draw(st.sampled_from([0, start + 1, GEO.model.num_layers])),
        )
    ]


NEAR_VALID_CALLS = {
    "PutPages": _put_pages_sequences,
    "GetPages": _get_pages,
    "ReadChunks": _read_chunks,
    "ReportAttention": _report_attention,
    "PutPrefix": _put_sequences,
    "Prefetch": _prefetch_sequences,
}


def _raw_requests(method):
    one = st.binary(max_size=64)
    return st.lists(one, min_size=1, max_size=3 if method.client_streaming else 1)


def _examples(default: int) -> int:
    return int(os.environ.get("KVSTORE_FUZZ_EXAMPLES", default))


def _run_fuzz(d, service, method, *, raw: bool, examples: int, derandomize: bool):
    """Fuzz one method; the fuzzer knows two prefixes' ids (and may delete or
    evict them), a third one it never sees, held open by a reader, must come
    through untouched."""
    guarded = _store_prefixes(d, [3])
    exposed = _store_prefixes(d, [1, 2])
    with KVStoreClient(d.target) as client:
        client.put_pages(PAGE_KEYS, make_pages(GEO, len(PAGE_KEYS), 11), GEO)
    seen = {}
    # a same-host client's shared-memory session, its id known to the fuzzer;
    # its leases go back when it closes, before the check below.  It reads the
    # guarded prefix throughout, so not even Evict may take that one.
    with grpc.insecure_channel(d.target) as channel, KVStoreClient(d.target, shm=True) as session:
        fuzzer = Fuzzer(sorted(exposed), geometry_to_pb(GEO), session.session_id)
        reader = session.prefetch(next(iter(guarded)), period_layers=GEO.group_layers)
        reader.send(0, [0])
        list(reader.groups(0))
        strategy = _raw_requests(method) if raw else _requests(fuzzer, method)

        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=derandomize,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        )
        @given(strategy)
        def fuzz(payload):
            code, details = _call(channel, service, method, payload, raw=raw)
            seen[code] = seen.get(code, 0) + 1
            assert code in ALLOWED, f"{method.name} answered {code.name}: {details!r} to {payload!r}"
            assert d.proc.poll() is None, f"daemon exited ({d.proc.returncode}) after {method.name}({payload!r})"

        fuzz()
        reader.close()
    _check_daemon_intact(d, guarded, exposed)
    return seen


def _check_daemon_intact(d, guarded: dict, exposed: dict):
    with KVStoreClient(d.target) as client:
        s = settled(client)
        assert s.shm_leased_bytes == 0 and s.pinned_units == 0, "a fuzzed call leaked a lease or a pin"
        listed = {p.prefix_id for p in client.list_prefixes()}
        assert set(guarded) <= listed
        for pid, kv in {**guarded, **exposed}.items():
            if pid not in listed:  # a fuzzed Delete may remove an exposed prefix
                continue
            num_chunks = client.describe(pid).num_chunks
            with client.read_chunks(pid, list(range(num_chunks))) as got:
                np.testing.assert_array_equal(got.to_kv(), kv)
        present = client.pages_exist(PAGE_KEYS, GEO).exists  # a fuzzed Evict may take the pages too
        if present.any():
            kept = [k for k, p in zip(PAGE_KEYS, present) if p]
            np.testing.assert_array_equal(client.get_pages(kept, GEO), make_pages(GEO, len(PAGE_KEYS), 11)[present])
    log = d.log()
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("service,method", METHODS, ids=[m.name for _, m in METHODS])
def test_fuzz_messages(fuzz_daemon, service, method):
    _run_fuzz(fuzz_daemon, service, method, raw=False, examples=_examples(150), derandomize=True)


@pytest.mark.parametrize("service,method", METHODS, ids=[m.name for _, m in METHODS])
def test_fuzz_raw_bytes(fuzz_daemon, service, method):
    seen = _run_fuzz(fuzz_daemon, service, method, raw=True, examples=_examples(15), derandomize=True)
    if method.input_type.fields:  # 0xff... never parses as a message with fields
        code, _ = _call(grpc.insecure_channel(fuzz_daemon.target), service, method, [b"\xff" * 7], raw=True)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{method.name}: undecodable body answered {code.name}"
    assert seen


@pytest.mark.slow
@pytest.mark.parametrize("service,method", METHODS, ids=[m.name for _, m in METHODS])
def test_fuzz_messages_long(fuzz_daemon, service, method):
    _run_fuzz(fuzz_daemon, service, method, raw=False, examples=_examples(400), derandomize=False)
