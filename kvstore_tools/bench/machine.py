"""What machine a benchmark ran on, recorded in every report beside its figures.

CPU model and count, kernel, Python, and the file system and block device
holding the benchmark's files (the figures mean little without them).
"""

from __future__ import annotations

import os
import platform


def machine_info(path: str) -> dict:
    """Where the job ran: CPU, kernel, and the file's file system and block device."""
    return {
        "cpu_model": _cpu_model(),
        "num_cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "filesystem": _filesystem_type(path),
        "block_device": _block_device(path),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _filesystem_type(path: str) -> str | None:
    """Type of the longest mount point that contains ``path`` (from /proc/mounts)."""
    target, best, fstype = os.path.realpath(path), "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                mount = fields[1]
                if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                    best, fstype = mount, fields[2]
    except OSError:
        return None
    return fstype


def _block_device(path: str) -> str | None:
    """Kernel name of the block device holding ``path`` (``vda``, ``nvme0n1``), if any."""
    dev = os.stat(path).st_dev
    sys_path = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if not os.path.exists(sys_path):
        return None
    real = os.path.realpath(sys_path)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    return os.path.basename(real)
