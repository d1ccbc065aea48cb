"""The client's page calls (``KVStoreClient`` has them): PagesExist, PutPages, GetPages.

``put_pages`` checks its input, then joins the group commit of its scope
(``put_batching``) or, when large, goes alone; ``get_pages`` and
``get_pages_into`` write exactly the layers asked for into a new array or
the caller's buffer (``pages.PageCollector``), from the shared-memory arena
when a session is open, else from the stream's frames.  Errors are
``KVStoreRpcError`` as for every call; a caller's bad input is ValueError
before anything is sent.
"""

from __future__ import annotations

import time

import numpy as np

from kvstore.contract import PagesPresent, PagesPutResult, geometry_to_pb, pages_present_from_pb, pages_put_from_pb, pb
from kvstore.contract.geometry import StoreGeometry

from . import pages as page_wire
from .put_batching import MergedPages, PutEntry, merge, split, timeout_of
from .rpc import PUT_ATTEMPTS, KVStoreRpcError, backoff, call, retryable, stream
from .shm import names_stale_session
from .tensors import as_numpy_kv, destination

FRAME_BYTES = 2 * 1024 * 1024  # the largest extent frame a put sends (below the 4 MiB message limit)


class PageCalls:
    """Mixed into ``KVStoreClient`` (``self.stub``, ``self._kw``, ``self._put_kw``, ``self.session``,
    ``self._reopen_session``, ``self._puts``)."""

    def pages_exist(self, keys, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> PagesPresent:
        """Which pages are stored, and how many leading ones (keys: bytes, or str as SGLang's)."""
        req = pb.PagesExistRequest(
            namespace=namespace, model_fingerprint=model_fingerprint, geometry=geometry_to_pb(geometry), keys=page_wire.as_keys(keys)
        )
        return pages_present_from_pb(call(self.stub.PagesExist, req, **self._kw(timeout)))

    def put_pages(self, keys, kv_pages, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> PagesPutResult:
        """Store ``kv_pages`` ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` under ``keys``;
        sends only pages not yet stored.  Calls of one scope made while a put of that scope is in flight
        go together in the next one (``put_batching``); each returns once its pages are durable."""
        arr = as_numpy_kv(kv_pages)
        keys = page_wire.as_keys(keys)
        page_wire.check_pages(arr, geometry, len(keys))
        entry = PutEntry(keys, arr, deadline=time.monotonic() + timeout if timeout is not None else float("inf"))
        scope = (namespace, model_fingerprint, geometry)
        if self._puts is None or arr.nbytes > self._puts.max_bytes // 4:
            return self._send_pages(scope, [entry])[0]
        return self._puts.put(scope, entry)

    def _send_pages(self, scope, entries: list[PutEntry]) -> list[PagesPutResult]:
        """One PutPages carrying every entry's pages (each key once); an answer per entry."""
        namespace, model_fingerprint, geometry = scope
        keys, sources = merge(entries)
        pages = MergedPages(entries, sources)
        timeout = timeout_of(entries)

        def attempt():
            present = self.pages_exist(keys, geometry, namespace=namespace, model_fingerprint=model_fingerprint, timeout=timeout)
            header = pb.PutPagesHeader(
                namespace=namespace,
                model_fingerprint=model_fingerprint,
                geometry=geometry_to_pb(geometry),
                keys=keys,
                skip_pages=np.flatnonzero(present.exists).tolist(),
            )
            frames = page_wire.put_stream(header, pages, geometry, FRAME_BYTES)
            return present, pages_put_from_pb(call(self.stub.PutPages, frames, **self._put_kw(timeout, pages.nbytes)))

        present, res = with_put_retries(attempt)
        return split(entries, sources, present.exists, res)

    def get_pages(
        self,
        keys,
        geometry: StoreGeometry,
        *,
        namespace="",
        model_fingerprint="",
        layer_start=0,
        layer_end=0,
        shm=None,
        timeout=None,
    ) -> np.ndarray:
        """``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]``: exactly the layers ``[layer_start, layer_end)``
        (``layer_end`` 0: through the last); NOT_FOUND names the first key not stored.  A new array; ``get_pages_into``
        fills the caller's own buffer.  ``shm`` (default: when a session is open) takes the pages from the
        shared-memory arena rather than the stream."""
        keys = page_wire.as_keys(keys)
        layers = page_wire.requested_layers(geometry, layer_start, layer_end)
        dtype = geometry.model.numpy_dtype()

        def new_array(num_pages, layers):
            out = np.empty(page_wire.page_shape(geometry, num_pages, len(layers)), dtype=dtype)
            return out, destination(out, out.shape, geometry.model.dtype)

        scope = (namespace, model_fingerprint, layer_start, layer_end)
        return self._get_pages(keys, geometry, scope, layers, new_array, shm, timeout)

    def get_pages_into(
        self,
        keys,
        out,
        geometry: StoreGeometry,
        *,
        namespace="",
        model_fingerprint="",
        layer_start=0,
        layer_end=0,
        shm=None,
        timeout=None,
    ):
        """Read pages into ``out``, the caller's ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` buffer for
        exactly the layers ``[layer_start, layer_end)``: a C-contiguous numpy array (bfloat16 as uint16) or torch tensor
        (the geometry's dtype) in host memory, pinned or not, or on a CUDA device; returns ``out``.

        Each extent is copied once, straight into ``out`` (a device through a pinned staging window), from the
        shared-memory arena (``shm``, default: when a session is open) or from the stream's frames: no whole-batch
        copy is made.  A wrong type, shape, dtype or layout is ValueError before anything is asked; if the read
        fails the contents of ``out`` are undefined."""
        keys = page_wire.as_keys(keys)
        layers = page_wire.requested_layers(geometry, layer_start, layer_end)
        if layers is not None:  # else the daemon refuses the range, naming the field
            dest = destination(out, page_wire.page_shape(geometry, len(keys), len(layers)), geometry.model.dtype)
        else:
            dest = None

        def given(num_pages, layers):
            if num_pages != len(keys) or dest is None:
                raise ValueError(f"GetPages answered {num_pages} pages for {len(keys)} keys")
            return out, dest

        scope = (namespace, model_fingerprint, layer_start, layer_end)
        return self._get_pages(keys, geometry, scope, layers, given, shm, timeout)

    def _get_pages(self, keys, geometry, scope, layers, dest_for, shm, timeout):
        """One GetPages into ``dest_for``'s buffer; a shm session the daemon no longer knows is reopened, and the
        call sent again, once, within its deadline."""
        use_shm = self.shm if shm is None else shm
        if use_shm and not self.shm:
            raise ValueError("no shared-memory session is open")
        namespace, model_fingerprint, layer_start, layer_end = scope
        req = pb.GetPagesRequest(
            namespace=namespace,
            model_fingerprint=model_fingerprint,
            geometry=geometry_to_pb(geometry),
            keys=keys,
            layer_start=layer_start,
            layer_end=layer_end,
        )
        deadline = time.monotonic() + (self.deadline_s if timeout is None else timeout)
        for last_try in (False, True):
            session = self.session if use_shm else None
            req.shm_session = session.session_id if session is not None else 0
            responses = stream(self.stub.GetPages, req, **self._kw(max(deadline - time.monotonic(), 0.001)))
            try:
                return page_wire.collect_pages(responses, geometry, layers, dest_for, session)
            except KVStoreRpcError as exc:
                if last_try or session is None or not names_stale_session(exc.code.name, exc.message):
                    raise
                self._reopen_session(session, deadline)


def with_put_retries(attempt):
    """``attempt()`` up to ``PUT_ATTEMPTS`` times: a put stream that fails retryably is sent again whole,
    after a fresh look at what is stored (the lookup or existence check is part of the attempt)."""
    for n in range(1, PUT_ATTEMPTS + 1):
        try:
            return attempt()
        except KVStoreRpcError as exc:
            if not retryable(exc) or n == PUT_ATTEMPTS:
                raise
        time.sleep(backoff(n))
