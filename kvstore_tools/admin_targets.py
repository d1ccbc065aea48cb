"""Where ``kvstore-admin``'s operations run: a data directory opened here, or a daemon.

``LocalAdmin`` opens the store in this process (``ChunkStore``, only while
no daemon holds the directory); ``RemoteAdmin`` asks a running daemon with
``KVStoreClient`` (``inspect``, ``verify``, ``evict`` and ``compact`` need
its admin RPCs; the conversation listings are data calls).  Both answer with the same plain dicts and lists, which
``kvstore_tools.admin`` turns into tables or JSON; ``connect`` picks one.
"""

from __future__ import annotations

import os
from dataclasses import asdict, fields

from kvstore import cli_flags
from kvstore.config import StoreConfig
from kvstore.contract.errors import KVStoreError, NotFound
from kvstore.progress import progress
from kvstore.store import ChunkStore

# Figures of this process's own reads and writes: meaningless for a store opened offline.
PROCESS_COUNTERS = ("bytes_read", "bytes_written", "reads", "puts", "deletes", "read_queue_depth")


def open_store(data_dir: str) -> ChunkStore:
    """Open an existing store; never creates one."""
    if not any(os.path.exists(os.path.join(data_dir, n)) for n in ("index", "segments", "STORE_ID")):
        raise NotFound(f"no kvstore data directory at {os.path.abspath(data_dir)}")
    return ChunkStore(StoreConfig(data_dir=data_dir))


class LocalAdmin:
    """The admin operations on a data directory opened in this process."""

    def __init__(self, store: ChunkStore):
        self.store = store

    def list_prefixes(self) -> list[dict]:
        return self.store.list_prefixes()

    def inspect(self, prefix: str) -> dict:
        return self.store.inspect(self.store.resolve(prefix))

    def stats(self) -> dict:
        return {k: v for k, v in self.store.stats().items() if k not in PROCESS_COUNTERS}

    def delete(self, prefix: str) -> str:
        prefix_id = self.store.resolve(prefix)
        self.store.delete(prefix_id)
        return prefix_id

    def verify(self, prefix: str | None) -> tuple[str | None, list[dict]]:
        prefix_id = self.store.resolve(prefix) if prefix else None
        return prefix_id, self.store.verify(prefix_id, progress=progress)

    def evict(self, to_bytes: int) -> dict:
        return self.store.capacity.evict_to(to_bytes)

    def list_conversations(self, namespace: str) -> list[dict]:
        conv = self.store.conversations
        return [conv.info(r, turns=False) for r in conv.records(namespace or None)]

    def get_conversation(self, conversation_id: str, namespace: str) -> dict:
        conv = self.store.conversations
        return conv.info(conv.get(namespace, conversation_id))

    def compact(self) -> dict:
        return self.store.capacity.compact_and_merge(progress=progress)

    def close(self) -> None:
        self.store.close()


ADMIN_RPCS = ("inspect", "verify", "evict", "compact")


class AdminDisabled(KVStoreError):
    """The daemon serves no KVStoreAdmin service (enable_admin is off)."""


class RemoteAdmin:
    """The same operations through a running daemon."""

    def __init__(self, client, where: str):
        self.client = client
        self.where = where

    def admin_call(self, name: str, *args):
        """``client.<name>(*args)``; UNIMPLEMENTED (no admin service) becomes one sentence."""
        from engine_client.client import KVStoreRpcError

        try:
            return getattr(self.client, name)(*args)
        except KVStoreRpcError as exc:
            if getattr(exc.code, "name", exc.code) != "UNIMPLEMENTED":
                raise
            raise AdminDisabled(
                f"the daemon at {self.where} does not serve admin calls ({', '.join(ADMIN_RPCS)}): "
                "start it with --enable-admin (enable_admin = true in [server])"
            ) from None

    def list_prefixes(self) -> list[dict]:
        return [_scalars(p, quarantined=p.quarantined or None) for p in self.client.list_prefixes()]

    def inspect(self, prefix: str) -> dict:
        return self.admin_call("inspect", prefix)

    def stats(self) -> dict:
        st = self.client.stats()
        out = _scalars(st, read_only=st.read_only or None)
        out["latency"] = [_scalars(row) for row in st.latency]
        return out

    def delete(self, prefix: str) -> str:
        return self.client.delete(prefix)

    def verify(self, prefix: str | None) -> tuple[str | None, list[dict]]:
        prefix_id = self.admin_call("inspect", prefix)["prefix_id"] if prefix else None
        reports = self.admin_call("verify", prefix_id or "")
        quarantined = {}
        for p in self.client.list_prefixes():
            if p.quarantined:
                quarantined.update({s["segment_id"]: p.quarantined for s in self.client.inspect(p.prefix_id)["segments"]})
        return prefix_id, [
            {**_scalars(r, error=r.error or None), "bad_regions": list(r.bad_regions), "quarantined": quarantined.get(r.segment_id)}
            for r in reports
        ]

    def evict(self, to_bytes: int) -> dict:
        res = self.admin_call("evict", to_bytes)
        return {**_scalars(res), "evicted": list(res.evicted)}

    def compact(self) -> dict:
        return _scalars(self.admin_call("compact"))

    def list_conversations(self, namespace: str) -> list[dict]:
        return [_conversation(c) for c in self.client.list_conversations(namespace)]

    def get_conversation(self, conversation_id: str, namespace: str) -> dict:
        return _conversation(self.client.get_conversation(conversation_id, namespace=namespace))

    def close(self) -> None:
        self.client.close()


def _scalars(value, **overrides) -> dict:
    """The scalar fields of a ``kvstore.contract`` result, in their order (tuples and nested values left out), then ``overrides``."""
    out = {f.name: getattr(value, f.name) for f in fields(value)}
    out = {k: v for k, v in out.items() if isinstance(v, (int, float, str, bool))}
    out.update(overrides)
    return out


def _conversation(info) -> dict:
    """A ``ConversationInfo`` as the plain dict ``Conversations.info`` makes."""
    out = asdict(info)
    out["turns"] = list(out["turns"])
    return out


def connect(args):
    """A RemoteAdmin when a daemon is named or found, else a LocalAdmin on the data directory."""
    socket_path, looked = args.socket_path, ""
    if socket_path and not os.path.exists(socket_path):
        raise NotFound(f"no daemon socket at {socket_path} (--socket-path)")
    if not (socket_path or args.tcp_address or args.data_dir_given):
        socket_path, looked = cli_flags.find_socket()
    if args.tcp_address or socket_path:
        from engine_client.client import KVStoreClient

        token = open(args.auth_token_file).read().strip() if args.auth_token_file else None
        ca = open(args.tls_ca_file, "rb").read() if args.tls_ca_file else None
        target = args.tcp_address or f"unix:{os.path.abspath(socket_path)}"
        client = KVStoreClient(target, shm=False, token=token, root_certificates=ca, deadline_s=args.timeout)
        return RemoteAdmin(client, target)
    try:
        return LocalAdmin(open_store(args.data_dir))
    except NotFound as exc:
        if not looked:
            raise
        raise NotFound(f"no daemon found ({looked}) and {exc}; give --socket-path, --tcp-address or --data-dir") from None
