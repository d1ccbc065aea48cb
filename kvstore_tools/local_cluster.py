"""A real Redis Cluster on loopback for tests and benchmarks: N masters with one replica each, in a temp directory.

Debian's ``redis-server`` (``make redis``) runs each node; ``redis-cli --cluster
create`` joins them.  Ports are free ones found at start (each node also
uses its port + 10000 for the cluster bus).  Every process is this object's
and ``close`` ends them all.  ``available()`` says whether the binaries are
there (tests skip without them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

NODE_TIMEOUT_MS = 1000  # failover within ~2 s of a master's death


def available() -> bool:
    return bool(shutil.which("redis-server") and shutil.which("redis-cli"))


def _free_port_pair(taken: set[int]) -> int:
    """A port p with p and p + 10000 both free (the cluster bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port in taken or port + 10000 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair on 127.0.0.1")


class LocalRedisCluster:
    def __init__(self, *, masters: int = 3, replicas: int = 1, maxmemory: str = "", policy: str = "allkeys-lru", password: str = ""):
        self.dir = tempfile.mkdtemp(prefix="kvredis")
        self.password = password
        self.ports: list[int] = []
        taken: set[int] = set()
        for _ in range(masters * (1 + replicas)):
            port = _free_port_pair(taken)
            taken |= {port, port + 10000}
            self.ports.append(port)
        self.masters, self.replicas = masters, replicas
        self.extra = ["--maxmemory", maxmemory, "--maxmemory-policy", policy] if maxmemory else []
        self.procs: dict[int, subprocess.Popen] = {}
        try:
            for port in self.ports:
                self.start_node(port)
            self._create()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[: self.masters])

    def start_node(self, port: int) -> None:
        node_dir = os.path.join(self.dir, str(port))
        os.makedirs(node_dir, exist_ok=True)
        args = [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            node_dir,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--appendonly",
            "yes",  # a node stopped and started again comes back with its data
            "--appendfsync",
            "no",
            "--save",
            "",
            "--repl-diskless-sync-delay",
            "0",  # a replica syncs at once (the default waits 5 s for more replicas)
            "--daemonize",
            "no",
            "--logfile",
            os.path.join(node_dir, "log"),
            *self.extra,
        ]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        self.procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ping(port)

    def cli(self, port: int, *args: str, check: bool = True) -> str:
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        res = subprocess.run(["redis-cli", "-p", str(port), *auth, *args], capture_output=True, text=True, timeout=30)
        if check and res.returncode != 0:
            raise RuntimeError(f"redis-cli -p {port} {' '.join(args)}: {res.stderr or res.stdout}")
        return res.stdout

    def _wait_ping(self, port: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.cli(port, "ping", check=False).strip() != "PONG":
            if time.monotonic() > deadline or self.procs[port].poll() is not None:
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.05)

    def _create(self) -> None:
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        subprocess.run(
            ["redis-cli", *auth, "--cluster", "create", *nodes, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()
        self.wait_replicas_online()

    def wait_ok(self, timeout_s: float = 30.0, ports=None) -> None:
        """Until every running node (or ``ports``) says cluster_state:ok and agrees on the slots."""
        deadline = time.monotonic() + timeout_s
        for port in ports or self.running():
            while "cluster_state:ok" not in self.cli(port, "cluster", "info", check=False):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster not ok on port {port}")
                time.sleep(0.1)

    def wait_replicas_online(self, timeout_s: float = 30.0) -> None:
        """Until every master that should have a replica has one in sync (WAIT can then succeed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            masters = self.master_ports()
            if masters and all("connected_slaves:0" not in self.cli(p, "info", "replication", check=False) for p in masters):
                if all("state=online" in self.cli(p, "info", "replication", check=False) for p in masters):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("replicas did not come online")
            time.sleep(0.1)

    def running(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def master_ports(self) -> list[int]:
        """Ports of the nodes serving slots as masters now (as a running node sees it)."""
        for port in self.running():
            out = self.cli(port, "cluster", "nodes", check=False)
            if out:
                ports = []
                for line in out.splitlines():
                    parts = line.split()
                    if "master" in parts[2] and "fail" not in parts[2] and len(parts) > 8:
                        ports.append(int(parts[1].split("@")[0].rsplit(":", 1)[1]))
                return sorted(ports)
        return []

    def master_of(self, key: str) -> int | None:
        """The port of the master serving ``key``'s slot now (None while nobody does: a failover in progress)."""
        slot = int(self.cli(self.running()[0], "cluster", "keyslot", key).strip())
        for line in self.cli(self.running()[0], "cluster", "nodes").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2].split(","):
                continue
            for rng in parts[8:]:
                lo, _, hi = rng.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return int(parts[1].split("@")[0].rsplit(":", 1)[1])
        return None

    def kill(self, port: int, sig=signal.SIGKILL) -> None:
        proc = self.procs[port]
        proc.send_signal(sig)
        proc.wait(30)

    def stop_all(self) -> None:
        for port in self.running():
            self.procs[port].send_signal(signal.SIGTERM)
        for port in list(self.procs):
            self.procs[port].wait(30)

    def start_all(self) -> None:
        for port in self.ports:
            if self.procs[port].poll() is not None:
                self.start_node(port)
        self.wait_ok()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
