"""Pages: chunks stored and fetched by a serving engine's own content keys.

A **page** is one chunk (``chunk_tokens`` tokens) of every layer of one
model: one extent per stored period group.  Serving engines name their KV
blocks by content: vLLM's block hash and SGLang HiCache's key of page ``j``
cover every token up to its end, so equal keys mean equal KV.  The store
takes a key as given (1 to 64 bytes) and files the page under its page hash
(``hashing.page_hashes``: namespace, model fingerprint and geometry
included), so a key means nothing outside its namespace and geometry.

A batch of new pages is stored exactly as a prefix put stores its chunks:
one segment (checksums, trailer, fdatasync), a manifest file, one index
commit, a disk reservation, eviction and compaction by the same score; the
small segments of many batches are merged into one later (``merge.py``).  Its
manifest is of kind ``pages``: its chunk hashes are the page hashes, its
``num_tokens`` is pages x ``chunk_tokens`` (the pages' tokens are not
known to the store), its id new for every put (so pages of a quarantined
batch can be stored again).  ``chunk_refs``
maps each page hash to the batch holding it, so looking a page up is one
index read, and verify, quarantine, ``rebuild-index``, eviction and the
listings treat a batch as they treat a prefix.

A put of a page already stored writes nothing for it: the put holds the
batch that stores it until the commit, and the commit fails as Conflict
(retry) if that page was deleted meanwhile, so an acknowledged put means
every one of its pages is stored.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from ..contract.errors import Conflict, InvalidArgument, NotFound
from ..contract.geometry import StoreGeometry
from ..contract.results import PagesPresent, PagesPutResult, ReadResult
from ..hashing import page_hashes
from ..holds import PrefixHolds
from ..reader import validate_groups
from ..records import PAGES, PrefixView
from ..scores import Unit
from .catalogue import Catalogue
from .pending_pages import PendingPages, validate_skip
from .pending_put import put_with_retries
from .puts import Writer
from .reads import Reader
from .scoring import Scoring
from .state import StoreState

MAX_KEY_BYTES = 64
READ_BATCH_BYTES = 32 << 20  # GetPages reads this many bytes of pages at a time (at least one page)
_BATCH_TAG = b"kvstore.page-batch.v1"
_LOCATE_ATTEMPTS = 3


def validate_keys(keys, max_pages: int, field_name: str = "keys") -> list[bytes]:
    """``keys`` as a list of bytes (1 to 64 each, no duplicates), or raise naming the field."""
    if isinstance(keys, (bytes, str)) or not hasattr(keys, "__len__"):
        raise InvalidArgument(field_name, "must be a sequence of byte strings")
    if len(keys) == 0:
        raise InvalidArgument(field_name, "must not be empty")
    if len(keys) > max_pages:
        raise InvalidArgument(field_name, f"{len(keys)} keys exceed the limit of {max_pages} pages per call")
    out, seen = [], {}
    for i, k in enumerate(keys):
        if not isinstance(k, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"{field_name}[{i}]", f"must be bytes, got {type(k).__name__}")
        k = bytes(k)
        if not 1 <= len(k) <= MAX_KEY_BYTES:
            raise InvalidArgument(f"{field_name}[{i}]", f"must be 1 to {MAX_KEY_BYTES} bytes, got {len(k)}")
        if k in seen:
            raise InvalidArgument(f"{field_name}[{i}]", f"duplicates keys[{seen[k]}]")
        seen[k] = i
        out.append(k)
    return out


def check_geometry(geometry) -> None:
    """Pages hold an engine's blocks as they are: every KV head, in its KV dtype (InvalidArgument naming the field)."""
    if not isinstance(geometry, StoreGeometry):
        raise InvalidArgument("geometry", "must be a StoreGeometry")
    if geometry.kv_quant:
        raise InvalidArgument("geometry.kv_quant", "pages hold an engine's blocks in its KV dtype; store them unquantized")
    if geometry.streaming_heads:
        raise InvalidArgument("geometry.streaming_heads", "pages hold every KV head of their chunk; store them without streaming heads")


def not_stored(index: int) -> NotFound:
    """The one answer for a page that is not there (or not the caller's to see)."""
    return NotFound(f"keys[{index}]: page is not stored")


def batch_id(hashes: list[bytes]) -> str:
    """A new id for a batch storing these page hashes."""
    h = hashlib.sha256(_BATCH_TAG + os.urandom(16))
    for ph in hashes:
        h.update(ph)
    return h.hexdigest()


@dataclass(frozen=True)
class PageLocation:
    view: PrefixView  # the batch (or, never in practice, prefix) holding the page
    chunk: int


@dataclass
class PageRead:
    """Extents of pages, in request order: ``extent_bytes(group, page)``."""

    geometry: StoreGeometry
    groups: list[int]
    num_pages: int
    bytes_read: int = 0
    bytes_useful: int = 0
    num_reads: int = 0
    _extents: dict = field(default_factory=dict, repr=False)  # (group, page) -> uint8 view

    def extent_bytes(self, group: int, page: int) -> np.ndarray:
        return self._extents[(group, page)]

    def add_extent(self, group: int, page: int, data: np.ndarray) -> None:
        self._extents[(group, page)] = data

    def to_array(self) -> np.ndarray:
        """``[pages, layers of the groups, 2, kv_heads, chunk_tokens, head_dim]`` in the KV dtype (a copy)."""
        geo = self.geometry
        per_group = []
        for g in self.groups:
            shape = geo.extent_shape(g, geo.chunk_tokens)
            per_group.append(np.stack([self._extents[(g, i)].view(geo.model.numpy_dtype()).reshape(shape) for i in range(self.num_pages)]))
        return np.concatenate(per_group, axis=1)


class PageStore:
    """The page operations of one ``ChunkStore``: stored through its writer, read through its reader."""

    def __init__(
        self,
        catalogue: Catalogue,
        writer: Writer,
        reader: Reader,
        scoring: Scoring,
        holds: PrefixHolds,
        state: StoreState,
        *,
        max_prefix_tokens: int,
    ):
        self._catalogue = catalogue
        self._writer = writer
        self._reader = reader
        self._scoring = scoring
        self._holds = holds
        self._state = state
        self._max_prefix_tokens = max_prefix_tokens
        # the remote tier's fill (store/remote_fill.RemoteFill: present, fill_pages), or None
        self.remote = None

    def max_pages(self, geometry: StoreGeometry) -> int:
        """Pages per call: as many as a prefix has chunks at most."""
        return max(1, self._max_prefix_tokens // geometry.chunk_tokens)

    def hashes(self, keys, geometry, namespace, model_fingerprint) -> tuple[list[bytes], list[bytes]]:
        """``(keys, page hashes)``, every argument validated (InvalidArgument naming the field)."""
        check_geometry(geometry)
        keys = validate_keys(keys, self.max_pages(geometry))
        return keys, page_hashes(keys, geometry, namespace, model_fingerprint)

    def locate(self, hashes: list[bytes]) -> list[PageLocation | None]:
        out = []
        for h in hashes:
            view = self._catalogue.holder(h)
            out.append(None if view is None else PageLocation(view, view.chunk_positions[h.hex()]))
        return out

    # ------------------------------------------------------------ exists
    def exists(self, keys, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "") -> PagesPresent:
        _, hashes = self.hashes(keys, geometry, namespace, model_fingerprint)
        present = [loc is not None for loc in self.locate(hashes)]
        if self.remote is not None and not all(present):  # pages the remote tier has count: GetPages fills them
            missing = [i for i, p in enumerate(present) if not p]
            for i, there in zip(missing, self.remote.present([hashes[i] for i in missing])):
                present[i] = there
        return PagesPresent(np.array(present, dtype=bool), present.index(False) if False in present else len(present))

    # ------------------------------------------------------------ put
    def begin_put(self, keys, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "", skip_pages=()) -> PendingPages:
        """First phase of a put: find the pages stored already, open a segment for the rest.

        ``skip_pages``: indices of pages the caller will not send because it
        found them stored; Conflict if one of them is not stored now.
        """
        self._state.check_writable()
        keys, hashes = self.hashes(keys, geometry, namespace, model_fingerprint)
        skip = validate_skip(skip_pages, len(keys))
        locations = self.locate(hashes)
        gone = [i for i in sorted(skip) if locations[i] is None]
        if gone:
            raise Conflict(f"skip_pages: page {gone[0]} is no longer stored; ask again which pages exist")
        hold = self._holds.hold(*sorted({loc.view.prefix_id for loc in locations if loc is not None}))
        try:
            new = [i for i, loc in enumerate(locations) if loc is None]
            present = [hashes[i] for i, loc in enumerate(locations) if loc is not None]
            pending = None
            if new:
                new_hashes = [hashes[i] for i in new]
                pending = self._writer.begin_chunks(
                    batch_id(new_hashes), new_hashes, geometry, namespace=namespace, model_fingerprint=model_fingerprint, kind=PAGES
                )
                pending.requires = present
        except BaseException:
            hold.release()
            raise
        return PendingPages(self._catalogue, geometry, len(keys), skip, new, present, pending, hold)

    def put(
        self, keys, kv_pages: np.ndarray, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = ""
    ) -> PagesPutResult:
        """Store ``kv_pages`` ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` under ``keys``."""
        return put_with_retries(
            lambda: self.begin_put(keys, geometry, namespace=namespace, model_fingerprint=model_fingerprint),
            lambda pending: pending.put_pages(kv_pages),
        )

    # ------------------------------------------------------------ read
    def hold(self, keys, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = ""):
        """``(locations, hold)``: every page located, its holders held against eviction and compaction.

        NotFound (``not_stored``) for the first page that is not stored.
        """
        _, hashes = self.hashes(keys, geometry, namespace, model_fingerprint)
        for attempt in range(_LOCATE_ATTEMPTS):
            locations = self.locate(hashes)
            missing = [i for i, loc in enumerate(locations) if loc is None]
            if missing and attempt == 0 and self.remote is not None:  # fill from the remote tier, then read locally
                if self.remote.fill_pages([hashes[i] for i in missing], geometry, namespace, model_fingerprint):
                    locations = self.locate(hashes)
                    missing = [i for i, loc in enumerate(locations) if loc is None]
            if missing:
                raise not_stored(missing[0])
            ids = sorted({loc.view.prefix_id for loc in locations})
            hold = self._holds.hold(*ids)
            # a delete or a compaction may have come between the look-up and the hold
            again = self.locate(hashes)
            if all(b is not None and (a.view.prefix_id, a.chunk) == (b.view.prefix_id, b.chunk) for a, b in zip(locations, again)):
                return again, hold
            hold.release()
        raise Conflict("pages moved while being located; retry")

    def units(self, locations: list[PageLocation], groups) -> list[dict[int, Unit]]:
        """Per page, group -> the stored unit (segment, local chunk, group) holding its extent: the memory tiers' key."""
        out: list[dict[int, Unit]] = [{} for _ in locations]
        for pid, pages in _by_holder(locations).items():
            chunks = sorted(locations[i].chunk for i in pages)
            units = self._catalogue.units(pid, chunks, groups)  # group-major, chunks ascending
            where = {(u[2], c): u for u, c in zip(units, chunks * len(groups))}
            for i in pages:
                for g in groups:
                    out[i][g] = where[(g, locations[i].chunk)]
        return out

    def read(self, locations: list[PageLocation], groups=None, *, coalesce: bool = True, alloc=None) -> PageRead:
        """Read held pages (``hold``): one store read per holding batch, checksums verified.

        ``alloc(nbytes)``: the buffer each store read goes into (a shared-memory lease), else private memory.
        """
        geo = locations[0].view.geometry
        grp = validate_groups(groups, geo.num_groups)
        out = PageRead(geo, grp, len(locations))
        for pid, pages in _by_holder(locations).items():
            chunks = np.array([locations[i].chunk for i in pages], dtype=np.int64)
            res: ReadResult = self._reader.read_held(pid, chunks, grp, coalesce=coalesce, alloc=alloc)
            for g in grp:
                for i, j in zip(pages, chunks.tolist()):
                    out.add_extent(g, i, res.extent_bytes(g, j))
            out.bytes_read += res.bytes_read
            out.bytes_useful += res.bytes_useful
            out.num_reads += res.num_reads
        return out

    def record_access(self, locations: list[PageLocation], groups) -> None:
        """``F_j += 1`` for every page read, as a ReadChunks read counts."""
        for pid, pages in _by_holder(locations).items():
            self._scoring.record_access(pid, [locations[i].chunk for i in pages], groups)

    def get(self, keys, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "", groups=None) -> PageRead:
        """Locate, hold, read, count: the whole read of ``keys`` in one call."""
        locations, hold = self.hold(keys, geometry, namespace=namespace, model_fingerprint=model_fingerprint)
        with hold:
            res = self.read(locations, groups)
            self.record_access(locations, res.groups)
            return res


def _by_holder(locations: list[PageLocation]) -> dict[str, list[int]]:
    """Page indices by the id of the batch holding them."""
    out: dict[str, list[int]] = {}
    for i, loc in enumerate(locations):
        out.setdefault(loc.view.prefix_id, []).append(i)
    return out
