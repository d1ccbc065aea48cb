"""``resp_into``: GET replies received into caller memory, however the stream is cut into reads."""

import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.remote.resp_into import NotPlain, pack_gets, read_gets_into


def _replies(values) -> bytes:
    out = b""
    for v in values:
        out += b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v)
    return out


def _read(stream: bytes, sizes, head: int, cuts: list[int]):
    a, b = socket.socketpair()

    def send():
        at = 0
        for cut in cuts + [len(stream)]:
            if cut > at:
                a.sendall(stream[at:cut])
                at = cut
        a.close()

    t = threading.Thread(target=send)
    t.start()
    try:
        outs = [memoryview(bytearray(n)) for n in sizes]
        return read_gets_into(b, outs, head), outs
    finally:
        t.join()
        b.close()


def test_pack_gets_is_resp2():
    assert pack_gets(["a", "kvx:{h}:0"]) == b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$9\r\nkvx:{h}:0\r\n"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(min_size=0, max_size=300_000)), min_size=1, max_size=6),
    st.integers(0, 16),
    st.lists(st.integers(0, 1_000_000), max_size=8),
    st.data(),
)
def test_values_land_in_their_buffers_however_the_stream_is_cut(values, head, cuts, data):
    sizes = [
        max(0, len(v) - head) if v is not None and len(v) >= head and data.draw(st.booleans()) else data.draw(st.integers(0, 50))
        for v in values
    ]
    stream = _replies(values)
    got, outs = _read(stream, sizes, head, sorted(c % (len(stream) + 1) for c in cuts))
    for v, n, g, out in zip(values, sizes, got, outs):
        if v is None:
            assert g is None and bytes(out) == bytes(n)
        elif len(v) == head + n:
            assert g == v[:head] and bytes(out) == v[head:]
        else:  # the whole value back, nothing written: the caller's check refuses its length
            assert g == v and bytes(out) == bytes(n)


@pytest.mark.parametrize(
    "stream, why",
    [
        (b"-MOVED 3999 127.0.0.1:7001\r\n", "MOVED"),
        (b"+OK\r\n", "OK"),
        (b"$3\r\nabcXY", "CRLF"),
    ],
)
def test_anything_but_a_value_or_nil_is_not_plain(stream, why):
    with pytest.raises(NotPlain, match=why):
        _read(stream, [3], 0, [])


def test_a_connection_closed_mid_value_is_an_os_error():
    with pytest.raises(ConnectionResetError):
        _read(b"$10\r\nabc", [10], 0, [])
