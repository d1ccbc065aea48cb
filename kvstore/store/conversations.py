"""Conversations: records naming the prefixes of a chain of turns.

After each turn a client stores the conversation's history (every previous
turn's tokens and KV) as an ordinary prefix (``PutPrefix``; its leading
chunks are the previous turn's, found by content hash and not written
again), then appends the turn here.  A record, per namespace and
conversation id, names those prefixes, so a worker can find, compress,
restore and delete a user's conversation::

    {conversation_id, namespace, model_fingerprint, state: "active" | "inactive",
     turns: [{turn, prefix_id, num_tokens, kv_bytes, created}],
     compressed: null | {prefix_id, format, strategy, num_tokens, kv_bytes},
     created, updated}

A turn's history must extend the previous turn's, while that is stored: its
first chunks are the previous turn's whole chunks, compared by their chained
hashes (``PrefixView.first_chunk_not_extended``; a shorter last chunk's
tokens are stored nowhere, so it compares only between histories that end
together).  One that does not is refused naming the first chunk that differs.

The rules (``appended``, ``marked_inactive`` and the checks of request
fields) are pure functions of a record and the prefixes' views
(``conversation_rules.py``); they raise before anything changes.  ``Conversations`` applies them: one lock per
record, the record file written durably (``conversation_files.py``), then
the index commit (``index_ops``), and only then the answer.

A record holds one prefix against eviction (``held_prefix_id``): the one a
restore reads, the compressed form of an inactive conversation that has
one, else the last turn's history.  The others (earlier turns, the
uncompressed history of a compressed conversation) stay cache entries:
eviction, like ``Delete``, may remove one, and the record then reports it
as not stored instead of failing.  Deleting the conversation releases its
hold.  ``stored_bytes``
counts the segment files of the prefixes still stored, each segment once
(chunks shared between turns count once; a segment shared with a prefix
outside the conversation counts whole).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time

import lmdb

from .. import index_ops as ops
from ..contract.errors import InvalidArgument, KVStoreError, NotFound, ReadOnly, StoreFull
from ..conversation_files import SUFFIX, ConversationFiles, encode, file_name
from ..conversation_rules import appended, check_format, check_key, held_prefix_id, marked_inactive, parse_strategy, prefix_ids
from ..faults import crash_point
from ..hashing import MAX_NAMESPACE_BYTES, validate_label
from ..holds import PrefixHolds
from ..identity import damaged, fsync_dir, write_atomic
from ..index import Index
from ..keyed_locks import KeyedLocks
from ..records import PrefixView
from .catalogue import Catalogue
from .compaction import Compactor
from .removal import Removal
from .state import StoreState

log = logging.getLogger("kvstore.store")


# ------------------------------------------------------------ the store's records
class Conversations:
    """The conversation records of one store: its index and its record files.

    Of the store it uses the catalogue (prefixes named by id), holds, state,
    and, to delete a record's prefixes, ``Removal`` and ``Compactor``.
    """

    def __init__(
        self,
        index: Index,
        files: ConversationFiles,
        catalogue: Catalogue,
        holds: PrefixHolds,
        state: StoreState,
        removal: Removal,
        compactor: Compactor,
        *,
        data_dir: str,
    ):
        self.index = index
        self.files = files
        self._catalogue = catalogue
        self._holds = holds
        self._state = state
        self._removal = removal
        self._compactor = compactor
        self._data_dir = data_dir
        self._locks = KeyedLocks()

    def append_turn(self, namespace: str, conversation_id: str, turn: int, prefix_id: str, *, resolve=None) -> dict:
        """Record ``turn``'s history prefix; ``resolve`` maps the id the caller gave to a full one it may use."""
        key = check_key(namespace, conversation_id)
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise InvalidArgument("turn", f"must be an integer >= 0, got {turn!r}")
        full_id = (resolve or self._catalogue.resolve)(prefix_id)
        with self._holds.hold(full_id), self._locks.locked(key):  # no eviction between describe and commit
            view = self._catalogue.describe(full_id)
            record = ops.conversation(self.index, key)
            previous = self._stored(record["turns"][-1]["prefix_id"]) if record else None
            new = appended(record, namespace, conversation_id, turn, view, time.time(), previous)
            if new is None:
                return record
            self._commit(key, record, new)
        return new

    def mark_inactive(
        self, namespace: str, conversation_id: str, compressed_prefix_id: str, fmt: str, strategy_json: str, *, resolve=None
    ) -> dict:
        """The conversation inactive, with its compressed form (``compressed_prefix_id`` "" = none)."""
        key = check_key(namespace, conversation_id)
        if compressed_prefix_id:
            check_format(fmt)
            strategy = parse_strategy(strategy_json)
        elif fmt or strategy_json:
            raise InvalidArgument("format" if fmt else "strategy_json", "must be empty without a compressed_prefix_id")
        else:
            strategy = {}
        full_id = (resolve or self._catalogue.resolve)(compressed_prefix_id) if compressed_prefix_id else None
        with self._holds.hold(full_id), self._locks.locked(key):  # no eviction between describe and commit
            view = None if full_id is None else self._catalogue.describe(full_id)
            record = self._record(key, namespace, conversation_id)
            new = marked_inactive(record, view, fmt, strategy, time.time())
            self._commit(key, record, new)
        return new

    def get(self, namespace: str, conversation_id: str) -> dict:
        return self._record(check_key(namespace, conversation_id), namespace, conversation_id)

    def held(self) -> set[str]:
        """The prefixes records keep from eviction, one per conversation (``held_prefix_id``)."""
        return {held_prefix_id(r) for r in ops.conversations(self.index).values()}

    def count(self) -> int:
        return ops.num_conversations(self.index)

    def records(self, namespace: str | None = None) -> list[dict]:
        """Every record (of one namespace), in namespace and id order."""
        if namespace is not None:
            validate_label("namespace", namespace, MAX_NAMESPACE_BYTES)
        return list(ops.conversations(self.index, namespace).values())

    def delete(self, namespace: str, conversation_id: str, *, delete_prefixes: bool = False) -> dict:
        """Remove the record; with ``delete_prefixes`` also the prefixes it names that no other record names.

        A prefix is deleted as eviction deletes one: claimed first, so one
        in use by a read or a put is kept; what was kept, and why, is in
        the answer.  A prefix that another conversation names at the same
        moment may go: that record then shows it as not stored, as after an
        eviction.
        """
        key = check_key(namespace, conversation_id)
        with self._locks.locked(key):
            record = self._record(key, namespace, conversation_id)
            self._state.check_writable()
            ops.delete_conversation(self.index, key)
            crash_point("conversation:deleted")
            try:
                self.files.remove(key)
            except OSError as exc:  # the delete is committed; a rebuild could bring the record back
                self._state.turn_read_only(f"removing the record file of conversation {conversation_id!r} failed: {exc.strerror or exc}")
        deleted, kept = [], []
        if delete_prefixes:
            named_elsewhere = {p for r in ops.conversations(self.index).values() for p in prefix_ids(r)}
            for pid in prefix_ids(record):
                why = "named by another conversation" if pid in named_elsewhere else self._delete_prefix(pid)
                if why is None:
                    deleted.append(pid)
                else:
                    kept.append((pid, why))
            if deleted:
                self._compactor.compact()
        return {"conversation_id": conversation_id, "deleted_prefixes": deleted, "kept_prefixes": kept}

    def info(self, record: dict, *, turns: bool = True) -> dict:
        """The record as ``ConversationInfo`` reports it: which prefixes are still stored, and bytes."""
        views = {}
        for pid in prefix_ids(record):
            try:
                views[pid] = self._catalogue.describe(pid)
            except NotFound:
                pass
        stored_bytes = sum(self._segment_bytes(s) for s in {s for v in views.values() for s in v.segment_ids})
        last, comp = record["turns"][-1], record["compressed"]
        return {
            "conversation_id": record["conversation_id"],
            "namespace": record["namespace"],
            "model_fingerprint": record["model_fingerprint"],
            "state": record["state"],
            "num_turns": len(record["turns"]),
            "num_tokens": last["num_tokens"],
            "turns": [{**t, "stored": t["prefix_id"] in views} for t in record["turns"]] if turns else [],
            "compressed": None
            if comp is None
            else {
                **{k: v for k, v in comp.items() if k != "strategy"},
                "strategy_json": json.dumps(comp["strategy"], separators=(",", ":"), sort_keys=True),
                "stored": comp["prefix_id"] in views,
            },
            "created": record["created"],
            "updated": record["updated"],
            "uncompressed_bytes": last["kv_bytes"],
            "compressed_bytes": comp["kv_bytes"] if comp else 0,
            "stored_bytes": stored_bytes,
            "missing_prefixes": len(prefix_ids(record)) - len(views),
        }

    # ------------------------------------------------------------ opening
    def reconcile_files(self) -> int:
        """Make the record files match the (cleanly opened) index; files changed.

        A change killed between its file and its index commit left a file
        the index does not hold (or holds otherwise): the index is what was
        acknowledged.
        """
        try:
            records = {file_name(k): encode(r) for k, r in ops.conversations(self.index).items()}
        except (lmdb.Error, ValueError, KeyError, TypeError) as exc:
            path = os.path.join(self.index.path, "data.mdb")
            raise damaged(self._data_dir, path, f"holds an undecodable conversation record ({exc.__class__.__name__})") from None
        changed = 0
        present = set()
        for name in self.files.names():
            path = os.path.join(self.files.directory, name)
            if name.endswith(SUFFIX) and name in records:
                present.add(name)
                with open(path, "rb") as fh:
                    if fh.read() == records[name]:
                        continue
                write_atomic(path, records[name])
            else:
                os.unlink(path)
            changed += 1
        for name in records.keys() - present:
            write_atomic(os.path.join(self.files.directory, name), records[name])
            changed += 1
        if changed:
            fsync_dir(self.files.directory)
            log.info("conversation record files: %d brought in line with the index", changed)
        return changed

    # ------------------------------------------------------------ internals
    def _record(self, key: bytes, namespace: str, conversation_id: str) -> dict:
        record = ops.conversation(self.index, key)
        if record is None:
            raise NotFound(f"conversation {conversation_id!r} is not stored in namespace {namespace!r}")
        return record

    def _stored(self, prefix_id: str) -> PrefixView | None:
        """The prefix's view, None when it is no longer stored (evicted or deleted)."""
        try:
            return self._catalogue.describe(prefix_id)
        except NotFound:
            return None

    def _commit(self, key: bytes, old: dict | None, new: dict) -> None:
        """Record file durable, then the index commit; the file put back if the commit fails."""
        state = self._state
        state.check_writable()
        try:
            self.files.write(key, new)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(f"data file system is full ({exc.strerror}) writing conversation {new['conversation_id']!r}") from None
            state.turn_read_only(f"writing the record file of conversation {new['conversation_id']!r} failed: {exc.strerror or exc}")
            raise ReadOnly(f"write not durable ({exc.strerror or exc}); store is now read-only") from None
        crash_point("conversation:file-written")
        try:
            ops.put_conversation(self.index, key, new)
        except BaseException:
            try:
                self.files.remove(key) if old is None else self.files.write(key, old)
            except OSError as exc:  # the next open brings the file in line with the index
                state.turn_read_only(f"restoring the record file of conversation {new['conversation_id']!r} failed: {exc.strerror or exc}")
            raise

    def _delete_prefix(self, prefix_id: str) -> str | None:
        """Delete one prefix as eviction does; why not, or None when deleted."""
        holds = self._holds
        if not holds.claim([prefix_id]):
            return "in use by a read or a put"
        try:
            self._removal.delete(prefix_id)
        except NotFound:
            return "not stored"
        except KVStoreError as exc:
            return str(exc)
        finally:
            holds.unclaim([prefix_id])
        return None

    def _segment_bytes(self, segment_id: int) -> int:
        try:
            return self._catalogue.segment_info(segment_id).layout.total_bytes
        except NotFound:  # freed since the prefix was described
            return 0
