"""The hardware a node's collectors read, in a module of its own so that collectors and the node that builds
them both import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.exporter.gpu.nvml import Nvml
from gpufleet.exporter.kernellog import KernelLog
from gpufleet.exporter.state import PersistentState
from gpufleet.exporter.tree import Tree


@dataclass(frozen=True)
class Hardware:
    """The boundary every collector reads through: the only part the simulator and the tests replace."""

    nvml: Nvml
    sysfs: Tree
    procfs: Tree
    # How long one NVML event wait may block. With a real driver it bounds how soon the XID watcher
    # notices that it should stop. A simulated driver wakes its waiters when it is unloaded, so the
    # simulator's thousand nodes can wait long and spare their threads a wake-up every second.
    nvml_event_wait_ms: int = 1000
    # What outlives a restart (`--path.state`): the disk for the exporter, memory for the simulator's nodes,
    # whose exporters restart within one process; nothing by default.
    state: PersistentState = field(default_factory=PersistentState)
    # The kernel log (`--path.kmsg`), or none: the simulator gives each node one of its own.
    kernel_log: KernelLog | None = None


def boot_time(procfs: Tree | None) -> float | None:
    """When the node booted (procfs `stat`, btime): a change means it rebooted. None where it cannot be read."""
    if procfs is None:
        return None
    try:
        text = procfs.read("stat").decode(errors="replace")
    except OSError:
        return None
    return next((float(line.split()[1]) for line in text.splitlines()
                 if line.startswith("btime ") and len(line.split()) == 2 and line.split()[1].isdigit()), None)
