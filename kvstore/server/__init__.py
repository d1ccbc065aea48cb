"""The kvstore daemon: gRPC service, shared-memory data path, lifecycle."""
