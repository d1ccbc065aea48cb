"""The two services (``KVStore``, ``KVStoreAdmin``): the client's stubs, the daemon's servicer bases.

Apart from the rest of the contract package because it loads grpc; the
daemon's in-process users (``ChunkStore.read`` returns a ``ReadResult``) do not.
"""

from ._proto import admin_pb2, kvstore_pb2
from ._proto.admin_pb2_grpc import KVStoreAdminServicer, KVStoreAdminStub, add_KVStoreAdminServicer_to_server
from ._proto.kvstore_pb2_grpc import KVStoreServicer, KVStoreStub, add_KVStoreServicer_to_server

# the two service descriptors (their methods, request and response types), KVStore first
SERVICES = (kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"], admin_pb2.DESCRIPTOR.services_by_name["KVStoreAdmin"])
KVSTORE_SERVICE, ADMIN_SERVICE = (s.full_name for s in SERVICES)  # "kvstore.v1.KVStore", "kvstore.v1.KVStoreAdmin"

__all__ = [
    "ADMIN_SERVICE",
    "KVSTORE_SERVICE",
    "SERVICES",
    "KVStoreAdminServicer",
    "KVStoreAdminStub",
    "KVStoreServicer",
    "KVStoreStub",
    "add_KVStoreAdminServicer_to_server",
    "add_KVStoreServicer_to_server",
]
