"""A page put between ``PageStore.begin_put`` and its commit: the pages sent, the new ones written as one batch.

Pages a put found stored already are not written again: their bytes, if
sent, are checked for size and order and dropped, and the commit fails as
Conflict (retry) if one of them was deleted meanwhile.
"""

from __future__ import annotations

import numpy as np

from ..contract.errors import Conflict, InvalidArgument
from ..contract.results import PagesPutResult
from .catalogue import Catalogue
from .pending_put import PendingPut


def validate_skip(skip_pages, num_pages: int) -> set[int]:
    out = set()
    for i in skip_pages:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < num_pages:
            raise InvalidArgument("skip_pages", f"index {i!r} out of range [0, {num_pages})")
        if i in out:
            raise InvalidArgument("skip_pages", f"duplicate index {i}")
        out.add(int(i))
    return out


class PendingPages:
    """A page put between ``begin_put`` and ``commit``/``abort``.

    The caller sends every page not in ``skip_pages``, each as one extent per
    period group (``page`` = its index in the put's keys).  Bytes of pages
    stored already are checked for size and order, then dropped; the new
    pages go into one segment (``PendingPut``).
    """

    def __init__(self, catalogue: Catalogue, geometry, num_pages, skip, new, present, pending: PendingPut | None, hold):
        self._catalogue = catalogue
        self.geometry = geometry
        self.num_pages = num_pages
        self.skip = skip
        self.pending = pending  # PendingPut of the new pages, or None
        self._local = {page: j for j, page in enumerate(new)}  # page index -> chunk of the new batch
        self._present = present  # page hashes stored already: still stored at the commit, or Conflict
        self._hold = hold  # the batches holding the present pages
        self._extent_bytes = np.array([geometry.extent_bytes(g, geometry.chunk_tokens) for g in range(geometry.num_groups)], dtype=np.int64)
        self._received = np.zeros((geometry.num_groups, num_pages), dtype=np.int64)

    @property
    def pages_written(self) -> int:
        return len(self._local)

    def put_extent_part(self, group: int, page: int, offset: int, payload) -> None:
        """Bytes ``[offset, offset+len)`` of the extent of ``page`` in ``group``; parts arrive in order."""
        geo = self.geometry
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or not 0 <= group < geo.num_groups:
            raise InvalidArgument("extent.group", f"must be in [0, {geo.num_groups}), got {group}")
        if isinstance(page, bool) or not isinstance(page, (int, np.integer)) or not 0 <= page < self.num_pages:
            raise InvalidArgument("extent.chunk", f"the page index must be in [0, {self.num_pages}), got {page}")
        if page in self.skip:
            raise InvalidArgument("extent.chunk", f"page {page} is in skip_pages; send nothing for it")
        n = len(memoryview(payload).cast("B")) if not isinstance(payload, np.ndarray) else payload.nbytes
        have, expected = int(self._received[group, page]), int(self._extent_bytes[group])
        if have == expected:
            raise InvalidArgument("extent", f"group {group} page {page} was already sent")
        if offset != have:
            raise InvalidArgument("extent.offset", f"group {group} page {page}: expected offset {have}, got {offset}")
        if n == 0 or offset + n > expected:
            raise InvalidArgument("extent.data", f"group {group} page {page}: {offset + n} bytes exceed the extent's {expected}")
        local = self._local.get(page)
        if local is not None:
            self.pending.put_extent_part(group, local, offset, payload)
        self._received[group, page] = have + n

    def put_pages(self, kv_pages: np.ndarray) -> None:
        """Send every page from ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]``."""
        geo = self.geometry
        m = geo.model
        expected = (self.num_pages, m.num_layers, 2, m.num_kv_heads, geo.chunk_tokens, m.head_dim)
        if not isinstance(kv_pages, np.ndarray) or kv_pages.shape != expected:
            got = kv_pages.shape if isinstance(kv_pages, np.ndarray) else type(kv_pages).__name__
            raise InvalidArgument(
                "kv_pages", f"must be a numpy array of shape {expected} [pages, layers, 2, kv_heads, chunk_tokens, head_dim], got {got}"
            )
        if kv_pages.dtype != m.numpy_dtype():
            raise InvalidArgument("kv_pages", f"dtype must be {m.numpy_dtype()} for {m.dtype}, got {kv_pages.dtype}")
        for g in range(geo.num_groups):
            layers = geo.group_layer_range(g)
            for i in range(self.num_pages):
                if i not in self.skip:
                    self.put_extent_part(g, i, 0, np.ascontiguousarray(kv_pages[i, layers.start : layers.stop]))

    def commit(self) -> PagesPutResult:
        """Every page sent, the new ones written, synced and indexed; then acknowledged."""
        try:
            sent = np.ones(self.num_pages, dtype=bool)
            sent[list(self.skip)] = False
            short = (self._received != self._extent_bytes[:, None]) & sent[None, :]
            if short.any():
                g, i = (int(x) for x in np.argwhere(short)[0])
                raise InvalidArgument("extents", f"{int(short.sum())} page extents missing or short, first: group {g} page {i}")
            if self.pending is None:
                if not self._catalogue.still_held(self._present):
                    raise Conflict("a page this put found stored was deleted concurrently; retry")
                res = None
            else:
                res = self.pending.commit()
        except BaseException:
            self.abort()
            raise
        self._hold.release()
        return PagesPutResult(
            num_pages=self.num_pages,
            pages_written=self.pages_written if res and not res.already_stored else 0,
            pages_already_stored=self.num_pages - (self.pages_written if res and not res.already_stored else 0),
            bytes_written=res.bytes_written if res else 0,
            batch_id=res.prefix_id if res else "",
        )

    def abort(self) -> None:
        """Drop the put (its segment, its reservation, its holds); a no-op after the commit."""
        if self.pending is not None:
            self.pending.abort()
        self._hold.release()
