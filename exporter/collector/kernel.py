"""Host kernel trouble from the kernel log: what makes a node a straggler or its job hang while its GPUs look
healthy.

Each message is matched against a few patterns and counted by the event it is, in `gpufleet_kernel_events_total`:
soft lockups and hung tasks (a CPU or a task stuck for seconds, often behind storage), NFS or Lustre servers not
responding, machine-check errors, and the OOM killer. Every event's series exists from the start, at 0, so that a
rate sees its first event. Storage timeouts are also counted by the server they name, in
`gpufleet_kernel_storage_timeouts_total`, so that one page for a shared file system's outage can name it. The log
is read at each collection from where the last one stopped (`exporter.kernellog`). Where it cannot be read (no
CAP_SYSLOG while `kernel.dmesg_restrict` is 1, no /dev/kmsg in a container) the collector says so once in the log
and in `gpufleet_kernel_log_readable`, and keeps trying; the collection itself succeeds, so that a node set up
without the capability does not open a ticket for a failing collector.

NVSwitch errors (SXids, `exporter.sxid`) are counted from the same log per switch, code and class. A fatal one
pages until the node reboots, so their counts are kept in the state file with the boot they belong to: an
exporter restarted between the error and the reboot serves them again, and one started after a reboot drops
them. The boot is known by its time, which the kernel derives from the clock and which moves by a second or
so as NTP steers it: a kept boot within `_SAME_BOOT` seconds of this one is this one, as no reboot is that
quick. Like the events, only the SXids logged while the exporter reads the log count.
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import ClassVar

from gpufleet.exporter.collector import Collection, FamilySet
from gpufleet.exporter.hardware import Hardware, boot_time
from gpufleet.exporter.kernellog import KernelLog, KernelLogReader
from gpufleet.exporter.state import PersistentState
from gpufleet.exporter.sxid import parse_sxid
from gpufleet.exporter.tree import Tree

log = logging.getLogger(__name__)
_SAME_BOOT = 60.0

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
# The server a storage timeout names: an NFS server's host, or a Lustre target (its file system and OST or MDT).
_NFS_SERVER = re.compile(r"nfs: server (\S+) not responding")
_LUSTRE_TARGET = re.compile(r"\b([\w.]+-(?:OST|MDT)[0-9a-fA-F]{4})\b|Connection to (\S+) \(at ")
# Distinct servers a node's series name, at most; later ones count as `other`. A node mounts a few file systems, but
# a name is the kernel's text, and the exporter's series must stay bounded whatever the log says.
MAX_STORAGE_SERVERS = 8


def storage_server(message: str) -> str:
    """The NFS server or Lustre target a storage timeout names, or `unknown` where it names neither."""
    if found := _NFS_SERVER.search(message) or _LUSTRE_TARGET.search(message):
        return next(group for group in found.groups() if group)
    return "unknown"


def classify(message: str) -> str | None:
    """The event a kernel message is, or None."""
    return next((event for event, pattern in EVENTS.items() if pattern.search(message)), None)


class KernelCollector:
    name: ClassVar[str] = "kernel"
    default_interval: ClassVar[float] = 15.0

    def __init__(self, kernel_log: KernelLog | None, state: PersistentState | None = None,
                 procfs: Tree | None = None) -> None:
        self._reader: KernelLogReader | None = kernel_log.reader() if kernel_log is not None else None
        self._counts = dict.fromkeys(EVENTS, 0)
        self._unreadable = ""  # Why the log could not be read, as last logged.
        self.state = state or PersistentState()
        self.procfs = procfs
        self._sxids: dict[tuple[str, str, str], int] = {}  # (switch, code, class) -> count since boot.
        self._storage: dict[str, int] = {}  # Server -> storage timeouts naming it since the exporter started.

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        return None

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> KernelCollector:
        return cls(hardware.kernel_log, hardware.state, hardware.procfs)

    def start(self) -> None:
        kept = self.state.section(self.name)
        booted = boot_time(self.procfs)
        kept_boot = kept.get("boot")
        if (booted is not None and isinstance(kept_boot, int | float) and abs(kept_boot - booted) < _SAME_BOOT
                and isinstance(kept.get("sxids"), list)):
            for entry in kept["sxids"]:
                if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[3], int):
                    self._sxids[(str(entry[0]), str(entry[1]), str(entry[2]))] = entry[3]
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
        sxids = families.counter("gpufleet_nvswitch_sxid_errors", "NVSwitch errors (SXids) the nvidia-nvswitch "
                                 "driver logged since the node booted, as the exporter read them, by switch (its PCI "
                                 "address), code and class (fatal, non_fatal, correctable), as the driver judged each.",
                                 ("switch", "sxid", "class"))
        for key, count in sorted(self._sxids.items()):
            sxids.add_metric(list(key), count)
        storage = families.counter("gpufleet_kernel_storage_timeouts", "Storage timeouts the kernel logged since the "
                                   f"exporter started, by the NFS server or Lustre target each named (the first "
                                   f"{MAX_STORAGE_SERVERS}; later ones as other).", ("server",))
        for server, count in sorted(self._storage.items()):
            storage.add_metric([server], count)
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
        sxids_changed = False
        for message in messages:
            if (event := classify(message)) is not None:
                self._counts[event] += 1
                if event == "storage_timeout":
                    server = storage_server(message)
                    if server not in self._storage and len(self._storage) >= MAX_STORAGE_SERVERS:
                        server = "other"
                    self._storage[server] = self._storage.get(server, 0) + 1
            elif (sxid := parse_sxid(message)) is not None:
                key = (sxid.switch, str(sxid.code), sxid.error_class)
                self._sxids[key] = self._sxids.get(key, 0) + 1
                sxids_changed = True
        if sxids_changed:
            self.state.update(self.name, {"boot": boot_time(self.procfs),
                                          "sxids": [[*key, count] for key, count in sorted(self._sxids.items())]})
        return True

    def stop(self) -> None:
        return None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
