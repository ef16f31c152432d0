"""What a process costs, read from /proc: the CPU and memory figures every benchmark prints."""

from __future__ import annotations

from pathlib import Path

import psutil


def status_mib(pid: int) -> dict[str, float]:
    """The memory fields of /proc/PID/status (VmHWM, VmRSS, RssAnon, RssFile, ...), in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.endswith(" kB"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM), or its RSS now where the kernel keeps no peak."""
    peak = status_mib(pid).get("VmHWM")
    return peak if peak is not None else psutil.Process(pid).memory_info().rss / 2**20


def disk_bytes(path: Path) -> int:
    """What the files under `path` take, each counted once: a link (a virtual environment's interpreter) is not
    followed to what it names."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU seconds the process has used."""
    times = process.cpu_times()
    return float(times.user + times.system)
