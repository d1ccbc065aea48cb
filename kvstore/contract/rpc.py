"""The two services (``KVStore``, ``KVStoreAdmin``): the client's stubs, the daemon's servicer bases.

Apart from the rest of the contract package because it loads grpc; the
daemon's in-process users (``ChunkStore.read`` returns a ``ReadResult``) do not.
"""

from ._proto import admin_pb2, kvstore_pb2
from ._proto.admin_pb2_grpc import KVStoreAdminServicer, KVStoreAdminStub, add_KVStoreAdminServicer_to_server
from ._proto.kvstore_pb2_grpc import KVStoreServicer, KVStoreStub, add_KVStoreServicer_to_server

KVSTORE_SERVICE = kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"].full_name  # "kvstore.v1.KVStore"
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["KVStoreAdmin"].full_name

__all__ = [
    "ADMIN_SERVICE",
    "KVSTORE_SERVICE",
    "KVStoreAdminServicer",
    "KVStoreAdminStub",
    "KVStoreServicer",
    "KVStoreStub",
    "add_KVStoreAdminServicer_to_server",
    "add_KVStoreServicer_to_server",
]
