from kvstore.contract._proto import cluster_pb2 as _cluster_pb2
from kvstore.contract._proto import conversations_pb2 as _conversations_pb2
from kvstore.contract._proto import pages_pb2 as _pages_pb2
from kvstore.contract._proto import prefixes_pb2 as _prefixes_pb2
from kvstore.contract._proto import reads_pb2 as _reads_pb2
from kvstore.contract._proto import scores_pb2 as _scores_pb2
from kvstore.contract._proto import stats_pb2 as _stats_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
