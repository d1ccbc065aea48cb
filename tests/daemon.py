"""Start a real kvstore daemon process on a unix socket for integration tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from helpers import child_pythonpath, data_root


class DaemonProcess:
    def __init__(self, data_dir: str, *extra: str, env: dict | None = None):
        # unix socket paths are limited to 108 bytes: keep them short
        self.run_dir = tempfile.mkdtemp(prefix="kvd", dir="/tmp")
        self.socket = os.path.join(self.run_dir, "sock", "kvstore.sock")
        self.ready = os.path.join(self.run_dir, "ready")
        self.log_path = os.path.join(self.run_dir, "daemon.log")
        self.data_dir = data_dir
        self.args = [
            sys.executable,
            "-m",
            "kvstore.cli",
            "serve",
            "--data-dir",
            data_dir,
            "--socket-path",
            self.socket,
            "--ready-file",
            self.ready,
            "--min-free-bytes",
            "0",
            "--enable-admin",
            "--shm-arena-bytes",
            str(32 << 20),
            *extra,
        ]
        self.env = {**os.environ, "PYTHONPATH": child_pythonpath(), **(env or {})}
        self.proc = None
        self.tcp_port = 0

    @property
    def target(self) -> str:
        return f"unix:{self.socket}"

    def start(self, timeout: float = 30.0) -> DaemonProcess:
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, env=self.env, cwd=data_root(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start (rc={self.proc.poll()}):\n{self.log()}")
            time.sleep(0.05)
        with open(self.ready) as fh:
            self.tcp_port = int(fh.read().split()[1])
        return self

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        if self.proc is not None and not self._log.closed:
            self._log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
