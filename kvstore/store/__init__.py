"""The chunk store: prefixes of KV cache as segment files plus an LMDB index.

Write order (docs/ARCHITECTURE.md, "Durability and safety invariants"):
segment data -> fdatasync -> directory fsync -> LMDB commit of the manifest
-> acknowledge.  A crash at any point before the commit leaves only an
unreferenced segment file, which the startup scan removes; a listed prefix
always has all of its bytes.  A failed fsync is never retried: the store
turns read-only until restarted.

Recovery without the index.  The store's identity (``identity.py``) is in
the index, in ``STORE_ID`` and in every segment's trailer
(``segment_trailer.py``: the segment record and the manifest of the put that
wrote it).  Every committed prefix also has a manifest file
(``manifests/``, see ``manifest_files.py``), written before its index
commit and removed after its delete's, so a put that writes no segment (all
chunks reused) is recoverable too, and a deleted prefix is not.
Conversation records (``conversations.py``) have record files the same way
(``conversation_files.py``).  The startup scan deletes a segment or manifest
file only when the index opened cleanly with this store's identity and does
not reference it; a missing, truncated, foreign or undecodable index is
``IndexDamaged`` and nothing is touched.  ``kvstore-admin rebuild-index``
(``rebuild.py``) restores every prefix with a manifest file whose pieces
all verify, finding chunks by hash wherever a compaction moved them.

The parts, each given only the pieces it uses (no part imports the facade,
none reaches into another's private attributes):

- ``chunk_store.py``: ``ChunkStore``, the facade: opens the directory,
  builds the parts, keeps the calls callers need;
- ``state.py``: ``StoreState``: read-only state, quarantine, counters,
  segment ids;
- ``catalogue.py``: ``Catalogue``: prefix and segment views (cached),
  ``resolve``, look-ups by chunk hash, units, and the index transactions
  that list, unlist and repoint prefixes;
- ``opening.py``: the startup scan;
- ``usage.py``: ``DiskUsage``: used and reserved bytes;
- ``new_segment.py``: ``SegmentSink`` / ``NewSegment``: a new segment file
  opened, written with its trailer, made durable (puts and compaction);
- ``puts.py`` and ``pending_put.py``: ``Writer.begin_put`` and
  ``PendingPut``, the two phases of a put;
- ``reads.py``: ``Reader``: extents, summaries and probe keys, verified;
- ``scoring.py``: ``Scoring``: access and attention into the score table,
  and its flush;
- ``removal.py``: ``Removal``: a prefix's delete;
- ``compaction.py``: ``Compactor``: segment compaction;
- ``merge.py``: ``SegmentMerger``: small page-batch segments merged into one;
- ``capacity.py``: ``DiskCapacity``: room for puts, eviction;
- ``admin.py``: ``Admin``: listings, inspect, verify;
- ``pages.py``: ``PageStore``: pages by an engine's content keys;
- ``conversations.py``: ``Conversations``: conversation records.
"""

from .chunk_store import ChunkStore, LookupResult, PendingPut, PutResult, put_with_retries

__all__ = ["ChunkStore", "LookupResult", "PendingPut", "PutResult", "put_with_retries"]
