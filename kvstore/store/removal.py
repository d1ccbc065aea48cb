"""Deleting a prefix: unlisted first, then its files.

Order (docs/ARCHITECTURE.md, "Durability and safety invariants"): the index
commit that unlists the prefix and releases its segments, then its manifest
file, then the segment files no prefix references any more.  A crash after
the commit leaves files the startup scan removes; a failed removal of the
manifest file turns the store read-only (a rebuild could bring the prefix
back).  Compaction of what the delete left mostly dead is the caller's
(``ChunkStore.delete``; eviction compacts once after its last victim).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import index as ix
from ..contract.errors import NotFound
from ..faults import crash_point
from ..manifest_files import ManifestFiles
from ..records import PrefixView
from ..scores import ScoreTable
from ..segment_files import SegmentFiles
from .catalogue import Catalogue
from .state import StoreState
from .usage import DiskUsage


class Removal:
    def __init__(
        self,
        catalogue: Catalogue,
        state: StoreState,
        manifest_files: ManifestFiles,
        files: SegmentFiles,
        scores: ScoreTable,
        usage: DiskUsage,
    ):
        self._catalogue = catalogue
        self._state = state
        self._manifest_files = manifest_files
        self._files = files
        self._scores = scores
        self._usage = usage
        # called with the view of each deleted prefix, after the delete (the remote tier's prefix directory)
        self.on_removed: list[Callable[[PrefixView], None]] = []

    def delete(self, prefix_id: str) -> list[int]:
        """Unlist the prefix, then free the segments no other prefix references; returns those."""
        self._state.check_writable()
        ix.prefix_key(prefix_id)  # InvalidArgument before the prefix's manifest lock is taken
        view = self._view(prefix_id) if self.on_removed else None
        with self._manifest_files.locked(prefix_id):
            freed, freed_bytes = self._catalogue.unlist(prefix_id)
            crash_point("delete:committed")
            self._remove_manifest_file(prefix_id)
        for seg_id in freed:
            self._scores.drop_segment(seg_id)
            self._files.remove(seg_id)
            self._state.forget(seg_id)
        self._state.count(deletes=1)
        self._usage.segments_freed(freed, freed_bytes)
        if view is not None:
            for hook in self.on_removed:
                hook(view)
        return freed

    def _view(self, prefix_id: str) -> PrefixView | None:
        try:
            return self._catalogue.describe(prefix_id)
        except NotFound:
            return None

    def _remove_manifest_file(self, prefix_id: str) -> None:
        try:
            self._manifest_files.remove(prefix_id)
        except OSError as exc:  # the delete is committed; a rebuild could bring the prefix back
            self._state.turn_read_only(f"removing the manifest file of {prefix_id} failed: {exc.strerror or exc}")
