"""``kvstore serve``: build the servers, run until SIGTERM, drain, stop.

Local clients use the unix socket (file modes are the access control).  The
optional TCP listener is a second gRPC server over the same servicers that
requires TLS and/or a bearer token, checked by one interceptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .. import faults
from ..config import StoreConfig
from ..contract import MAX_MESSAGE_BYTES, rpc
from ..contract.errors import BackendUnavailable, InvalidArgument, KVStoreError, StartupError
from ..file_modes import FILE_MODE
from ..remote import RemoteConfig
from ..remote.router import Router
from ..store import ChunkStore
from . import sockets
from .arena import Arena
from .auth import BearerTokenInterceptor, read_auth_token_file
from .config import ServerConfig
from .data_channel import DataChannels
from .notify import notify
from .remote import REMOTE_SERVICE, RemoteWatch, connect_tier
from .servicer import AdminServicer, KVStoreServicer, Service
from .shm_sessions import PeerPolicy, ShmSessions
from .status import add_service
from .tiers import TierManager, gpu_memory

log = logging.getLogger(__name__)


SERVICES = ("kvstore.v1.KVStore",)
UNWIND_SECONDS = 5.0  # after the grace, how long cancelled calls get to release what they hold


class Daemon:
    def __init__(self, store_config: StoreConfig, config: ServerConfig, remote_config: RemoteConfig | None = None):
        self.store_config = store_config
        self.config = config
        self.remote_config = remote_config or RemoteConfig()
        self.remote_tier = self.remote_watch = None
        self.servers: list[grpc.aio.Server] = []
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        self.stopped = asyncio.Event()
        self._socket_ident: tuple[int, int] | None = None
        self.data_channels: DataChannels | None = None

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            if getattr(self, "metrics_server", None) is not None:
                self.metrics_server.close()
            if getattr(self, "data_channels", None) is not None:
                self.data_channels.close()
            raise

    async def _start(self) -> None:
        """Check credentials and claim every listening address, then open the store and serve.

        Every configuration problem (token or TLS files, a TCP port in use, a
        socket path taken by a live daemon or by something else) raises
        InvalidArgument naming the key before the store opens or a socket is bound.
        """
        cfg = self.config
        tcp = self._bind_tcp() if cfg.tcp_address else None
        self.data_channels, data_reason = self._bind_data_channels()
        self.metrics_server = None
        if cfg.metrics_address:
            from .prom import MetricsServer  # prometheus_client only when metrics are on

            self.metrics_server = MetricsServer(cfg.metrics_address)
        with_arena = bool(cfg.shm_arena_bytes and cfg.socket_path)
        if cfg.socket_path:
            sockets.claim(cfg.socket_path, "socket_path")
        if with_arena:
            sockets.claim(cfg.shm_socket, "shm_socket_path")
        self.remote_tier, unreachable = connect_tier(self.remote_config)  # a refusal stops here, in one line
        try:
            with startup_step("data_dir", self.store_config.data_dir):
                self.store = ChunkStore(self.store_config, remote=self.remote_tier, remote_config=self.remote_config)
        except BaseException:
            if self.remote_tier is not None:
                self.remote_tier.close()
            raise
        if unreachable:
            self.store.remote_link.mark_degraded(unreachable)
        with startup_step("shm_arena_bytes", cfg.shm_arena_bytes):
            self.arena = Arena(cfg.shm_arena_bytes, cfg.shm_slot_bytes, tier_bytes=cfg.cpu_tier_bytes) if with_arena else None
        self.tiers = TierManager(
            self.arena,
            self.store.scores,
            policy=cfg.cache_policy,
            # GPU hits reach clients through the arena: no arena, no GPU tier
            gpu=gpu_memory(cfg.gpu_tier_bytes, cfg.gpu_tier_device) if self.arena is not None else None,
        )
        log.info(
            "memory tiers (%s policy): gpu %d bytes%s, cpu %d bytes, prefetch reserve %d bytes (of a %d-byte arena)",
            cfg.cache_policy,
            self.tiers.capacity("gpu"),
            f" ({self.tiers.gpu.kind})" if self.tiers.gpu is not None else "",
            self.tiers.capacity("cpu"),
            self.arena.lease_bytes if self.arena else 0,
            cfg.shm_arena_bytes if self.arena else 0,
        )
        self.sessions = None
        if self.arena is not None:
            policy = PeerPolicy(cfg.allowed_uids, cfg.allowed_gids, cfg.max_shm_sessions)
            self.sessions = ShmSessions(self.arena, cfg.shm_socket, policy)
            with startup_step("shm_socket_path", cfg.shm_socket):
                self.sessions.start()
        # extents of deleted, evicted and compacted segments leave memory (pinned ones age out)
        self.store.capacity.on_segments_freed.append(self.tiers.drop_segment)
        self.service = Service(self.store, cfg, self.arena, self.sessions, self.tiers)
        # small page-batch segments merge in the background, never on a put's acknowledging path
        self.store.merger.on_due.append(self._merge_in_background)
        self.service.data_channels, self.service.data_channel_reason = self.data_channels, data_reason
        if self.remote_tier is not None:
            self.service.router = Router(self.remote_tier, max_tokens=self.store_config.max_prefix_tokens)
            where = cfg.tcp_address or f"unix:{cfg.socket_path}"
            self.remote_watch = RemoteWatch(self.store, self.remote_config, self._set_serving, where)
        if self.metrics_server is not None:
            self.metrics_server.serve(self.service)
        if cfg.socket_path:
            server = self._server([])
            bound = sockets.private_path(cfg.socket_path)
            with startup_step("socket_path", cfg.socket_path):
                server.add_insecure_port(f"unix:{bound}")
                await server.start()
                os.chmod(bound, 0o660)
            self._socket_ident = sockets.publish(bound, cfg.socket_path, "socket_path")
            self.servers.append(server)
            log.info("listening on unix:%s (shm: %s)", cfg.socket_path, cfg.shm_socket if self.arena else "off")
        if tcp is not None:
            self._add_services(tcp)
            await tcp.start()
            self.servers.append(tcp)
            log.info(
                "listening on tcp %s (port %d, tls=%s, mtls=%s, tokens=%s)",
                cfg.tcp_address,
                self.tcp_port,
                bool(cfg.tls_cert_file),
                bool(cfg.tls_ca_file),
                bool(cfg.auth_token_file),
            )
        status = health_pb2.HealthCheckResponse.SERVING if not self.store.read_only else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *SERVICES):
            await self._set_health(name, status)
        if self.remote_tier is not None:
            await self._set_serving(REMOTE_SERVICE, not unreachable)

    def _merge_in_background(self) -> None:
        try:
            self.service.pool.submit(self.store.merger.merge_due)
        except RuntimeError:  # the pool is shut down: the daemon is stopping
            pass

    def _bind_tcp(self) -> grpc.aio.Server:
        """A TCP server bound (not started) on tcp_address, its tokens and TLS files read."""
        cfg = self.config
        tokens = read_auth_token_file(cfg.auth_token_file) if cfg.auth_token_file else {}
        creds = _tls_credentials(cfg) if cfg.tls_cert_file else None
        sockets.check_tcp_free(cfg.tcp_address)
        server = self._new_server([BearerTokenInterceptor(tokens)] if tokens else [])
        try:
            port = server.add_secure_port(cfg.tcp_address, creds) if creds else server.add_insecure_port(cfg.tcp_address)
        except RuntimeError as exc:
            raise InvalidArgument("tcp_address", f"cannot listen on {cfg.tcp_address}: {exc}") from None
        if not port:
            raise InvalidArgument("tcp_address", f"cannot listen on {cfg.tcp_address} (in use, or not a local address)")
        self.tcp_port = port
        return server

    def _bind_data_channels(self) -> tuple[DataChannels | None, str]:
        """The data port beside the TCP listener, or None and why there is none."""
        cfg = self.config
        if not cfg.tcp_address:
            return None, "the daemon has no TCP listener"
        if not cfg.data_channel:
            return None, "data_channel is off"
        if cfg.tls_cert_file:
            return None, "the TCP listener uses TLS and data connections are plaintext"
        host = cfg.tcp_address.rsplit(":", 1)[0].strip("[]")
        try:
            channels = DataChannels(host, cfg.data_channel_port, max_conns=cfg.max_data_channels, send_timeout_s=cfg.stream_idle_seconds)
        except OSError as exc:
            raise InvalidArgument("data_channel_port", f"cannot listen on {host}:{cfg.data_channel_port}: {exc}") from None
        log.info("data connections on %s port %d (bulk reads for TCP clients)", host, channels.port)
        return channels, ""

    def _new_server(self, interceptors) -> grpc.aio.Server:
        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),  # a port in use is an error, never shared with another daemon
        ]
        return grpc.aio.server(interceptors=interceptors, options=opts)

    def _server(self, interceptors) -> grpc.aio.Server:
        server = self._new_server(interceptors)
        self._add_services(server)
        return server

    def _add_services(self, server: grpc.aio.Server) -> None:
        add_service(rpc.add_KVStoreServicer_to_server, KVStoreServicer(self.service), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [rpc.KVSTORE_SERVICE, health.SERVICE_NAME]
        if self.config.enable_admin:
            add_service(rpc.add_KVStoreAdminServicer_to_server, AdminServicer(self.service), server)
            names.append(rpc.ADMIN_SERVICE)
        if self.config.enable_reflection:
            from grpc_reflection.v1alpha import reflection

            reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)

    @property
    def metrics_port(self) -> int:
        return self.metrics_server.port if self.metrics_server is not None else 0

    async def _set_health(self, name: str, status) -> None:
        res = self.health.set(name, status)
        if asyncio.iscoroutine(res):
            await res

    async def _set_serving(self, name: str, serving: bool) -> None:
        await self._set_health(name, health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def watch_remote(self) -> None:
        """Check the remote tier's health every remote_health_seconds (``remote.RemoteWatch``); nothing without one."""
        if self.remote_watch is not None:
            await self.remote_watch.run(self.stopped)

    async def watch_read_only(self) -> None:
        """Report NOT_SERVING on health once the store turned read-only."""
        while not self.stopped.is_set():
            if self.store.read_only:
                for name in ("", *SERVICES):
                    await self._set_health(name, health_pb2.HealthCheckResponse.NOT_SERVING)
                return
            try:
                await asyncio.wait_for(self.stopped.wait(), 1.0)
            except TimeoutError:
                pass

    async def flush_scores(self) -> None:
        """Persist changed cache scores every score_flush_seconds (and at stop)."""
        while not self.stopped.is_set():
            try:
                await asyncio.wait_for(self.stopped.wait(), self.config.score_flush_seconds)
            except TimeoutError:
                pass
            if self.store.read_only or self.stopped.is_set():
                continue
            try:
                await self.service.run(self.store.flush_scores)
            except Exception:  # scores are advisory: log and keep serving
                log.exception("could not persist cache scores")

    async def stop(self) -> None:
        """NOT_SERVING, refuse new calls, let in-flight calls finish, stop."""
        notify("STOPPING=1")
        log.info("draining: NOT_SERVING, refusing new calls, grace %.1fs", self.config.grace_seconds)
        for name in ("", *SERVICES):
            await self._set_health(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        # New calls get UNAVAILABLE from the servicer while running calls
        # finish; only then do the listeners close.
        if not await self.service.drain(self.config.grace_seconds):
            log.warning("%d calls still running after %.1fs; cancelling them", self.service.active_calls, self.config.grace_seconds)
        await asyncio.gather(*(s.stop(0) for s in self.servers))
        # Cancelled streams unwind (their leases and pins go back) before the
        # arena they point into is unmapped.
        if not await self.service.drain(UNWIND_SECONDS):
            log.warning("%d cancelled calls did not unwind within %.1fs", self.service.active_calls, UNWIND_SECONDS)
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.sessions is not None:
            self.sessions.stop()
        if self.data_channels is not None:
            self.data_channels.close()
        self.service.pool.shutdown(wait=True)
        self.service.delivery_pool.shutdown(wait=True)
        self.store.close()
        if self.remote_tier is not None:
            self.remote_tier.close()
        if self.arena is not None:
            self.arena.close()
        if self.config.socket_path:
            sockets.release(self.config.socket_path, self._socket_ident)
        self.stopped.set()
        log.info("stopped")


@contextlib.contextmanager
def startup_step(key: str, value):
    """A failure to use what ``key`` names (an OSError, a store that will not open) as StartupError naming the key.

    ``data_dir: /x: permission denied`` rather than ``[Errno 13] ...``; an
    unusable backend names ``backend``.  Configuration errors pass unchanged.
    """
    try:
        yield
    except (InvalidArgument, StartupError):
        raise
    except BackendUnavailable as exc:
        raise StartupError("backend", str(exc)) from None
    except OSError as exc:
        where = exc.filename or value
        raise StartupError(key, f"{where}: {(exc.strerror or str(exc)).lower()}") from None
    except (KVStoreError, RuntimeError) as exc:
        raise StartupError(key, str(exc) if str(value) in str(exc) else f"{value}: {exc}") from None


def _tls_credentials(cfg: ServerConfig) -> grpc.ServerCredentials:
    def read(key: str) -> bytes:
        path = getattr(cfg, key)
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise InvalidArgument(key, f"cannot read {path}: {exc.strerror}") from None

    ca = read("tls_ca_file") if cfg.tls_ca_file else None
    return grpc.ssl_server_credentials(
        [(read("tls_key_file"), read("tls_cert_file"))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


async def run(
    store_config: StoreConfig, config: ServerConfig, ready_file: str | None = None, remote_config: RemoteConfig | None = None
) -> None:
    if faults.IGNORED:
        log.warning("ignoring %s: fault injection needs %s=1 (tests only)", " and ".join(faults.IGNORED), faults.SWITCH)
    if faults.ENABLED:
        log.warning("fault injection is on (%s=1): a test build, not for production", faults.SWITCH)
    daemon = Daemon(store_config, config, remote_config)
    await daemon.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.ensure_future(daemon.watch_read_only())
    flusher = asyncio.ensure_future(daemon.flush_scores())
    remote_watch = asyncio.ensure_future(daemon.watch_remote())
    if ready_file:  # written whole, then renamed: a reader never sees it half done
        fd = os.open(ready_file + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        with open(fd, "w") as fh:
            fh.write(f"{os.getpid()} {getattr(daemon, 'tcp_port', 0)} {daemon.metrics_port}\n")
        os.replace(ready_file + ".tmp", ready_file)
    log.info("kvstore daemon ready (pid %d)", os.getpid())
    notify("READY=1")
    await stop.wait()
    await daemon.stop()
    await asyncio.gather(watcher, flusher, remote_watch)
