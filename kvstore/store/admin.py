"""Admin views of the chunk store: listings, inspect and verify.

None of it is on the data path (lookup, read, put).  Verify re-reads whole
segments and quarantines one that fails, as a failed read would.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import xxhash

from ..io import IOBackend, aligned_buffer
from ..records import PrefixView
from ..segment_files import SegmentFiles, segment_file_name
from .catalogue import Catalogue
from .state import StoreState


class Admin:
    def __init__(self, catalogue: Catalogue, state: StoreState, files: SegmentFiles, backend: IOBackend):
        self._catalogue = catalogue
        self._state = state
        self._files = files
        self._backend = backend

    def verify(self, prefix_id: str | None = None, *, progress=None) -> list[dict]:
        """Re-read every checksummed region (of one prefix, or of the store).

        ``progress(iterable, desc)`` wraps the loop over segments (a bar, see kvstore.progress).
        """
        if prefix_id is not None:
            seg_ids = self._catalogue.describe(prefix_id).segment_ids
        else:
            seg_ids = self._catalogue.segment_ids()
        if progress is not None:
            seg_ids = progress(seg_ids, "verify", total=len(seg_ids), unit="seg")
        return [self.verify_segment(s) for s in seg_ids]

    def verify_segment(self, segment_id: int) -> dict:
        state = self._state
        seg = self._catalogue.segment_info(segment_id)
        bad: list[str] = []
        error = None
        buf = aligned_buffer(seg.layout.total_bytes)
        try:
            with self._files.reading(segment_id) as fh:
                self._files.pread(fh, buf, 0).result()
        except (OSError, EOFError) as exc:
            error = f"{exc.__class__.__name__}: {exc}"
        if error is None:
            arr = np.frombuffer(buf, dtype=np.uint8)
            for name, off, length, xx in seg.regions():
                if xxhash.xxh3_64_intdigest(arr[off : off + length]) != xx:
                    bad.append(name)
            state.count(bytes_read=len(buf))
        if bad or error:
            state.quarantine(segment_id, error or f"checksum mismatch in {bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else ""))
        return {
            "segment_id": segment_id,
            "ok": not bad and error is None,
            "regions": len(seg.regions()),
            "bad_regions": bad,
            "error": error,
            "quarantined": state.quarantined.get(segment_id),
        }

    def list_prefixes(self) -> list[dict]:
        out = []
        for m in self._catalogue.manifests():
            view = PrefixView.from_manifest(m)
            out.append(
                {
                    "prefix_id": view.prefix_id,
                    "namespace": view.namespace,
                    "model_fingerprint": view.model_fingerprint,
                    "num_tokens": view.num_tokens,
                    "num_chunks": view.num_chunks,
                    "num_segments": len(view.segment_ids),
                    "created": view.created,
                    "quarantined": self._state.prefix_quarantine(view),
                    "kind": view.kind,
                }
            )
        return out

    def inspect(self, prefix_id: str) -> dict:
        catalogue, state = self._catalogue, self._state
        view = catalogue.describe(prefix_id)
        recs = catalogue.segment_records(view.segment_ids)
        segments = []
        for p in view.pieces:
            lay = catalogue.segment_info(p.segment_id).layout
            segments.append(
                {
                    **p.to_dict(),
                    "file": segment_file_name(p.segment_id),
                    "segment_chunks": lay.num_chunks,
                    "total_bytes": lay.total_bytes,
                    "payload_bytes": lay.payload_bytes,
                    "padding_bytes": lay.padding_bytes,
                    "refcount": recs[p.segment_id]["refcount"],
                    "checksums": len(catalogue.segment_info(p.segment_id).regions()),
                    "quarantined": state.quarantined.get(p.segment_id),
                }
            )
        geo = view.geometry
        return {
            "prefix_id": view.prefix_id,
            "kind": view.kind,
            "namespace": view.namespace,
            "model_fingerprint": view.model_fingerprint,
            "geometry": geo.to_dict(),
            "num_tokens": view.num_tokens,
            "num_chunks": view.num_chunks,
            "num_groups": geo.num_groups,
            "kv_quant": geo.kv_quant or geo.model.dtype,
            "kv_bytes": view.kv_bytes,  # as stored (quantized when kv_quant)
            "kv_bytes_unquantized": view.num_tokens * geo.model.num_layers * geo.model.token_layer_bytes,
            # (layer, KV head) pairs whose rows extents leave out (their sink and recent rows are client pages)
            "streaming_heads": sum(map(len, geo.streaming_heads)),
            "kv_bytes_full_layout": dataclasses.replace(geo, streaming_heads=()).kv_bytes(view.num_tokens),
            "segments": segments,
            "created": view.created,
            "quarantined": state.prefix_quarantine(view),
        }
