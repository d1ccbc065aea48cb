"""The chunk store: prefixes of KV cache as segment files plus an LMDB index.

``ChunkStore`` (``chunk_store.py``) is the one entry point; its parts are
the modules beside it (docs/ARCHITECTURE.md, "store").
"""

from .chunk_store import ChunkStore, LookupResult, PendingPut, PutResult, put_with_retries

__all__ = ["ChunkStore", "LookupResult", "PendingPut", "PutResult", "put_with_retries"]
