"""Group commit of small page puts: concurrent ``put_pages`` calls of one scope share one PutPages call.

The daemon writes the new pages of one PutPages as one segment with one
fdatasync, one manifest file and one index entry (a batch).  An engine
saves the blocks of many requests at once, each call a few pages: sent one
by one, every call pays its own segment, sync and ``ls`` row.  Here the
calls of one scope (namespace, model fingerprint, geometry) that arrive
while a put of that scope is in flight wait, and the next put carries all
of them (up to ``max_pages`` and ``max_bytes``): one segment, one sync, one
batch.  A lone call goes at once, so nothing waits for a timer; each call
returns only when the put carrying its pages is acknowledged, so an answer
still means every one of its pages is durable.  A call's input is checked
before it joins (a refused call changes nothing); a put that fails fails
every call it carried, with the same error.

``merge``/``MergedPages``/``split`` are the pure part (which bytes go, what
each call is told); ``PutQueue`` (threads) and ``AsyncPutQueue`` (asyncio)
only decide who sends and when.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from kvstore.contract import PagesPutResult

from .rpc import KVStoreRpcError

MAX_PAGES = 256  # pages of one merged put (the daemon refuses more than max_prefix_tokens / chunk_tokens)
MAX_BYTES = 64 << 20  # bytes of one merged put; a call larger than a quarter of it goes alone


@dataclass(eq=False)
class PutEntry:
    """One caller's ``put_pages``: checked keys and ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` pages."""

    keys: list[bytes]
    pages: np.ndarray
    deadline: float = float("inf")
    result: PagesPutResult | None = None
    error: BaseException | None = None
    done: bool = False
    abandoned: bool = False


# ------------------------------------------------------------ what one merged put sends and answers
def merge(entries: list[PutEntry]) -> tuple[list[bytes], list[tuple[int, int]]]:
    """The merged put's keys (each once, first come first) and, per key, (entry, page) of the bytes sent for it."""
    keys, sources, seen = [], [], set()
    for e, entry in enumerate(entries):
        for p, key in enumerate(entry.keys):
            if key not in seen:
                seen.add(key)
                keys.append(key)
                sources.append((e, p))
    return keys, sources


class MergedPages:
    """The pages of a merged put as ``pages.put_stream`` reads them (``[i, layers]``), without copying them together."""

    def __init__(self, entries: list[PutEntry], sources: list[tuple[int, int]]):
        self._entries, self._sources = entries, sources
        self.shape = (len(sources), *entries[0].pages.shape[1:])
        self.nbytes = sum(entries[e].pages[p].nbytes for e, p in sources)

    def __getitem__(self, index):
        i, rest = index
        e, p = self._sources[i]
        return self._entries[e].pages[p][rest]


def split(entries: list[PutEntry], sources: list[tuple[int, int]], stored: np.ndarray, res: PagesPutResult) -> list[PagesPutResult]:
    """Each call's answer from the merged put's: ``stored`` says which merged keys were stored before it.

    A call is told the pages whose bytes it sent and the daemon wrote; bytes are shared out by pages."""
    if len(entries) == 1 and len(sources) == len(entries[0].keys):
        return [res]
    new = [0] * len(entries)
    for (e, _), was in zip(sources, stored.tolist()):
        new[e] += not was
    left = res.pages_written  # fewer than asked if pages were stored meanwhile: the first calls are told first
    out = []
    for entry, n in zip(entries, new):
        written = min(n, left)
        left -= written
        nbytes = res.bytes_written * written // res.pages_written if res.pages_written else 0
        out.append(PagesPutResult(len(entry.keys), written, len(entry.keys) - written, nbytes, res.batch_id if written else ""))
    return out


def timeout_of(entries: list[PutEntry]) -> float | None:
    """The merged put's deadline: the latest of its callers' (None: one of them has none of its own)."""
    if any(e.deadline == float("inf") for e in entries):
        return None
    return max(max(e.deadline for e in entries) - time.monotonic(), 0.001)


def take(queue: list[PutEntry], max_pages: int, max_bytes: int) -> list[PutEntry]:
    """The entries the next put carries: from the head while within the limits (at least one)."""
    batch, pages, nbytes = [], 0, 0
    for entry in queue:
        if batch and (pages + len(entry.keys) > max_pages or nbytes + entry.pages.nbytes > max_bytes):
            break
        batch.append(entry)
        pages += len(entry.keys)
        nbytes += entry.pages.nbytes
    del queue[: len(batch)]
    return batch


def _settle(batch: list[PutEntry], send) -> None:
    """``send(batch)`` (-> one answer per entry); every entry done with its answer or the error."""
    try:
        results = send(batch)
    except BaseException as exc:  # noqa: BLE001 - handed to every caller the put carried
        for entry in batch:
            entry.error, entry.done = exc, True
        return
    for entry, r in zip(batch, results):
        entry.result, entry.done = r, True


def _outcome(entry: PutEntry) -> PagesPutResult:
    if entry.error is not None:
        raise entry.error
    return entry.result


def _waiting(st, entry: PutEntry) -> float | None:
    """How long a caller waits for the put in flight (None: until it ends); DEADLINE_EXCEEDED, out of the
    queue, once its own deadline passed before its pages were sent (pages in flight wait for their put)."""
    if entry not in st.queue:
        return None
    left = entry.deadline - time.monotonic()
    if left <= 0:
        st.queue.remove(entry)
        raise KVStoreRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "put_pages: the deadline passed while these pages waited for a put")
    return None if left == float("inf") else left


# ------------------------------------------------------------ who sends, and when
@dataclass
class _Scope:
    queue: list = field(default_factory=list)
    sending: bool = False


class PutQueue:
    """Group commit for threads: a caller that finds no put of its scope in flight sends the queue's head."""

    def __init__(self, send, *, max_pages: int = MAX_PAGES, max_bytes: int = MAX_BYTES):
        self._send = send  # send(scope, entries) -> [PagesPutResult per entry]
        self.max_pages, self.max_bytes = max_pages, max_bytes
        self._cv = threading.Condition()
        self._scopes: dict = {}

    def put(self, scope, entry: PutEntry) -> PagesPutResult:
        with self._cv:
            st = self._scopes.setdefault(scope, _Scope())
            st.queue.append(entry)
        while True:
            with self._cv:
                while not entry.done and st.sending:
                    left = _waiting(st, entry)
                    self._cv.wait(left)
                if entry.done:
                    return _outcome(entry)
                st.sending = True
                batch = take(st.queue, self.max_pages, self.max_bytes)
            try:
                _settle(batch, lambda b: self._send(scope, b))
            finally:
                with self._cv:
                    st.sending = False
                    if not st.queue:
                        self._scopes.pop(scope, None)
                    self._cv.notify_all()


class AsyncPutQueue:
    """``PutQueue`` for one event loop."""

    def __init__(self, send, *, max_pages: int = MAX_PAGES, max_bytes: int = MAX_BYTES):
        self._send = send  # async send(scope, entries) -> [PagesPutResult per entry]
        self.max_pages, self.max_bytes = max_pages, max_bytes
        self._cv = asyncio.Condition()
        self._scopes: dict = {}

    async def put(self, scope, entry: PutEntry) -> PagesPutResult:
        async with self._cv:
            st = self._scopes.setdefault(scope, _Scope())
            st.queue.append(entry)
        while True:
            async with self._cv:
                while not entry.done and st.sending:
                    left = _waiting(st, entry)
                    try:
                        await asyncio.wait_for(self._cv.wait(), left)
                    except TimeoutError:
                        pass
                if entry.done:
                    return _outcome(entry)
                st.sending = True
                batch = take(st.queue, self.max_pages, self.max_bytes)
            try:
                try:
                    results = await self._send(scope, batch)
                except asyncio.CancelledError:  # the caller that sent it was cancelled: the others are told so
                    for e in batch:
                        e.error, e.done = KVStoreRpcError(grpc.StatusCode.CANCELLED, "the put carrying these pages was cancelled"), True
                    raise
                except BaseException as exc:  # noqa: BLE001 - handed to every caller the put carried
                    for e in batch:
                        e.error, e.done = exc, True
                else:
                    for e, r in zip(batch, results):
                        e.result, e.done = r, True
            finally:
                async with self._cv:
                    st.sending = False
                    if not st.queue:
                        self._scopes.pop(scope, None)
                    self._cv.notify_all()
