"""The gRPC stubs of the two services (``KVStore``, ``KVStoreAdmin``).

Apart from the rest of the wire package because it loads grpc; the daemon's
in-process users (``ChunkStore.read`` returns a ``ReadResult``) do not.
"""

from .._proto.kvstore_pb2_grpc import KVStoreAdminStub, KVStoreStub

__all__ = ["KVStoreAdminStub", "KVStoreStub"]
