"""Host kernel trouble from the kernel log: what makes a node a straggler or its job hang while its GPUs look
healthy.

Each message is matched against a few patterns and counted by the event it is, in `gpufleet_kernel_events_total`:
soft lockups and hung tasks (a CPU or a task stuck for seconds, often behind storage), NFS or Lustre servers not
responding, machine-check errors, and the OOM killer. Every event's series exists from the start, at 0, so that
a rate sees its first event. The log is read at each collection from where the last one stopped
(`exporter.kernellog`). Where it cannot be read (no CAP_SYSLOG while `kernel.dmesg_restrict` is 1, no
/dev/kmsg in a container) the collector says so once in the log and in `gpufleet_kernel_log_readable`, and
keeps trying; the collection itself succeeds, so that a node set up without the capability does not open a
ticket for a failing collector.
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import ClassVar

from gpufleet.exporter.collector import Collection, FamilySet
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.kernellog import KernelLog, KernelLogReader

log = logging.getLogger(__name__)

# event -> the messages that are one, as the kernel writes them.
EVENTS = {
    "soft_lockup": re.compile(r"soft lockup - CPU#\d+ stuck for"),
    "hung_task": re.compile(r"INFO: task .+ blocked for more than \d+ seconds"),
    "storage_timeout": re.compile(r"nfs: server \S+ not responding|Lustre(?:Error)?: .*(?:timed out|was lost)"),
    # One message per error: the kernel's own record of it, or EDAC's where EDAC takes the error, and never the
    # "Machine check events logged" notice, which may follow either.
    "machine_check": re.compile(r"\[Hardware Error\]: CPU \d+: Machine Check|Machine Check Exception|"
                                r"EDAC \S+: \d+ [CU]E "),
    # Once per kill, on every kernel: "Out of memory: Killed process", the memory cgroup's, and the separate
    # "Killed process" line of kernels before 5.0.
    "oom_kill": re.compile(r"Killed process \d+ \("),
}


def classify(message: str) -> str | None:
    """The event a kernel message is, or None."""
    return next((event for event, pattern in EVENTS.items() if pattern.search(message)), None)


class KernelCollector:
    name: ClassVar[str] = "kernel"
    default_interval: ClassVar[float] = 15.0

    def __init__(self, kernel_log: KernelLog | None) -> None:
        self._reader: KernelLogReader | None = kernel_log.reader() if kernel_log is not None else None
        self._counts = dict.fromkeys(EVENTS, 0)
        self._unreadable = ""  # Why the log could not be read, as last logged.

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        return None

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> KernelCollector:
        return cls(hardware.kernel_log)

    def start(self) -> None:
        self._read()  # Positions the reader at the end of the log: what came before the exporter is not counted.

    def collect(self) -> Collection:
        readable = self._read()
        families = FamilySet()
        events = families.counter("gpufleet_kernel_events", "Kernel log messages of host trouble since the "
                                  "exporter started, by event.", ("event",))
        for event, count in self._counts.items():
            events.add_metric([event], count)
        families.gauge("gpufleet_kernel_log_readable", "1 when the exporter can read the kernel log.",
                       ()).add_metric([], 1.0 if readable else 0.0)
        return families.collection()

    def held(self, hung: bool) -> Collection:
        return Collection(())

    def _read(self) -> bool:
        if self._reader is None:
            return False
        try:
            messages = self._reader.read()
        except OSError as err:
            reason = err.strerror or str(err)
            if reason != self._unreadable:
                log.warning("kernel log unreadable: %s; kernel events are not counted until it can be read "
                            "(it needs CAP_SYSLOG, and /dev/kmsg in a container)", reason)
                self._unreadable = reason
            return False
        if self._unreadable:
            log.info("kernel log readable again")
            self._unreadable = ""
        for message in messages:
            if (event := classify(message)) is not None:
                self._counts[event] += 1
        return True

    def stop(self) -> None:
        return None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
