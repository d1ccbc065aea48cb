"""``kvstore health``: the standard gRPC health check (grpc.health.v1) on a daemon's socket, for probes."""

from __future__ import annotations

import sys

from .cli_flags import unix_target


def check(socket_path: str, service: str = "", timeout_s: float = 5.0) -> int:
    """Print the serving status; exit status 0 only when SERVING, 1 otherwise (one stderr line when unreachable)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = unix_target(socket_path)
    try:
        with grpc.insecure_channel(target) as channel:
            res = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError as exc:
        print(f"kvstore health: {target}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(res.status))
    return 0 if res.status == health_pb2.HealthCheckResponse.SERVING else 1
