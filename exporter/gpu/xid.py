"""XID errors: every critical XID event, counted per GPU and code.

dcgm-exporter exports the last XID code as a gauge, so a repeated XID is
invisible. Here every event increments `gpufleet_gpu_xid_errors_total`, so two
identical XIDs count twice.

Events come from two sources:

* `NvmlXidWatcher`, in a thread of its own, registers every GPU for critical XID events and waits on
  the event set with a bounded wait. After a driver loss it re-registers with
  backoff. The counts live in the `XidLedger`, not in the NVML session, so
  they survive failed collections and driver reloads. Where the driver
  offers it, the same event set also carries the GPU's recovery-action
  event: the verdict is read as the event arrives and kept in the ledger
  for the next collection, so one the driver gives and takes back between
  two collections is acted on, unless it was taken back before the watcher
  read it.
* `KernelLogXids` (on by default, where the log is readable) reads the kernel
  log for `NVRM: Xid` lines at each GPU collection, and while a collection
  hangs. This catches the XID that took NVML down with it. A kernel-log XID is
  counted only if NVML did not report the same GPU and code within the
  de-duplication window; it is held back for that long before it counts.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from gpufleet.exporter.gpu.nvml import DRIVER_LOST, Backoff, EventSet, Handle, Nvml, as_text
from gpufleet.exporter.gpu.probes import field_value
from gpufleet.exporter.kernellog import KernelLog
from gpufleet.exporter.sxid import Sxid, parse_sxid

log = logging.getLogger(__name__)

_NO_LIBRARY = frozenset({pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
# Per GPU, between two collections (and fatal SXids per node): more would only repeat what was already said.
_VERDICTS_KEPT = 8
PciKey = tuple[int, int, int]  # PCI domain, bus, device: what both NVML and the kernel log name.

_PCI = re.compile(r"^(?:[0-9a-fA-F]+:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$")
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d+)\s*,"
)


def pci_key(bus_id: str) -> PciKey | None:
    """`00000000:18:00.0` (NVML) and `0000:18:00` (kernel log) both -> (0, 0x18, 0)."""
    match = _PCI.match(bus_id.strip())
    if not match:
        return None
    return int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16)


def parse_xid_line(line: str) -> tuple[PciKey, int] | None:
    """The GPU and XID code of an `NVRM: Xid (PCI:0000:18:00): 79, ...` kernel log line, else None."""
    match = _XID_LINE.search(line)
    if not match:
        return None
    key = pci_key(match.group(1))
    return None if key is None else (key, int(match.group(2)))


@dataclass(frozen=True)
class XidCount:
    gpu: int
    uuid: str
    xid: int
    count: int
    last_timestamp: float


@dataclass
class _Event:
    pci: PciKey
    xid: int
    at: float
    matched: bool = False


class XidLedger:
    """XID counts per GPU and code, shared by the event sources and read by the GPU collector."""

    def __init__(self, *, clock: Callable[[], float] = time.time, dedup_window: float = 10.0) -> None:
        self.clock = clock
        self.dedup_window = dedup_window  # A kernel-log XID is counted this long after it is read, at most.
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str, int], tuple[int, float]] = {}
        self._gpus: dict[PciKey, tuple[int, str]] = {}
        self._nvml_events: list[_Event] = []
        self._kmsg_pending: list[_Event] = []
        self._verdicts: dict[str, list[int]] = {}
        self._fatal_sxids: list[Sxid] = []
        self.watching = False  # True while NVML events are registered for at least one GPU.

    def register_gpu(self, index: int, uuid: str, pci_bus_id: str) -> None:
        key = pci_key(pci_bus_id)
        if key is not None:
            with self._lock:
                self._gpus[key] = (index, uuid)

    def record_nvml(self, index: int, uuid: str, pci_bus_id: str, xid: int) -> None:
        now = self.clock()
        with self._lock:
            self._count(index, uuid, xid, now)
            event = _Event(pci_key(pci_bus_id) or (-1, -1, -1), xid, now)
            for pending in self._kmsg_pending:
                if not pending.matched and (pending.pci, pending.xid) == (event.pci, xid):
                    pending.matched = event.matched = True
                    break
            self._nvml_events.append(event)
            self._expire(now)

    def record_kmsg(self, pci: PciKey, xid: int) -> None:
        now = self.clock()
        with self._lock:
            for event in self._nvml_events:
                if not event.matched and (event.pci, event.xid) == (pci, xid) and now - event.at <= self.dedup_window:
                    event.matched = True
                    return
            self._kmsg_pending.append(_Event(pci, xid, now))
            self._expire(now)

    def record_verdict(self, uuid: str, action: int) -> None:
        """The driver's recovery action for a GPU, read when its recovery-action event arrived."""
        with self._lock:
            verdicts = self._verdicts.setdefault(uuid, [])
            verdicts.append(action)
            del verdicts[:-_VERDICTS_KEPT]

    def take_verdicts(self) -> dict[str, list[int]]:
        """The verdicts recorded since the last call, oldest first, by GPU UUID."""
        with self._lock:
            verdicts, self._verdicts = self._verdicts, {}
        return verdicts

    def record_fatal_sxid(self, sxid: Sxid) -> None:
        """A fatal NVSwitch error read from the kernel log, for the GPU collector to hold the board for."""
        with self._lock:
            self._fatal_sxids.append(sxid)
            del self._fatal_sxids[:-_VERDICTS_KEPT]

    def take_fatal_sxids(self) -> list[Sxid]:
        """The fatal SXids recorded since the last call, oldest first."""
        with self._lock:
            sxids, self._fatal_sxids = self._fatal_sxids, []
        return sxids

    def snapshot(self) -> list[XidCount]:
        now = self.clock()
        with self._lock:
            self._expire(now)
            return [XidCount(gpu, uuid, xid, count, last)
                    for (gpu, uuid, xid), (count, last) in sorted(self._counts.items())]

    def kept(self) -> list[dict[str, object]]:
        """The counts as the exporter's state file keeps them: by GPU UUID, since indexes can change."""
        with self._lock:
            return [{"uuid": uuid, "xid": xid, "count": count, "last": last}
                    for (_, uuid, xid), (count, last) in sorted(self._counts.items())]

    def restore(self, kept: list[dict[str, object]], gpus: dict[str, int]) -> tuple[int, list[XidCount]]:
        """Add counts a previous process kept, for the GPUs this node has now (UUID to index). Returns how many
        entries named a GPU it does not have (replaced, or a file from another host), which are dropped, and the
        counts carried over."""
        ignored, carried = 0, []
        with self._lock:
            for entry in kept:
                try:
                    uuid, xid, count, last = (str(entry["uuid"]), int(str(entry["xid"])), int(str(entry["count"])),
                                              float(str(entry["last"])))
                except (KeyError, ValueError, TypeError):  # Not a mapping, or a field of the wrong kind.
                    ignored += 1
                    continue
                if uuid not in gpus:
                    ignored += 1
                    continue
                key = (gpus[uuid], uuid, xid)
                now, latest = self._counts.get(key, (0, 0.0))
                self._counts[key] = (now + count, max(latest, last))
                carried.append(XidCount(gpus[uuid], uuid, xid, count, last))
        return ignored, carried

    def forget(self, uuid: str) -> int:
        """Drop a GPU's counts (a board no longer in its slot); returns how many entries there were."""
        with self._lock:
            gone = [key for key in self._counts if key[1] == uuid]
            for key in gone:
                del self._counts[key]
        return len(gone)

    def _count(self, index: int, uuid: str, xid: int, at: float) -> None:
        count, _ = self._counts.get((index, uuid, xid), (0, 0.0))
        self._counts[(index, uuid, xid)] = (count + 1, at)

    def _expire(self, now: float) -> None:
        """Count kernel-log XIDs that NVML did not report within the window; forget old events."""
        keep = []
        for pending in self._kmsg_pending:
            if pending.matched:
                continue
            if now - pending.at < self.dedup_window:
                keep.append(pending)
                continue
            gpu = self._gpus.get(pending.pci)
            if gpu is None:
                log.warning("XID %d in the kernel log for PCI %04x:%02x:%02x, a GPU NVML never listed; not counted",
                            pending.xid, *pending.pci)
            else:
                self._count(gpu[0], gpu[1], pending.xid, pending.at)
        self._kmsg_pending = keep
        self._nvml_events = [e for e in self._nvml_events if now - e.at <= self.dedup_window]


def _handle_key(handle: Handle) -> int:
    """A hashable identity for an NVML device handle (a ctypes pointer, or a simulated object)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class NvmlXidWatcher:
    """Waits for critical XID events on every GPU, in a daemon thread, and records them in the ledger."""

    def __init__(self, nvml: Nvml, ledger: XidLedger, *, wait_ms: int = 1000,
                 backoff_initial: float = 1.0, backoff_max: float = 60.0) -> None:
        self._nvml = nvml
        self._ledger = ledger
        self._wait_ms = wait_ms
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid-nvml", daemon=True)
        self._last_failure = ""

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to end; it does once its current bounded wait returns."""
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except (pynvml.NVMLError, TimeoutError) as err:  # TimeoutError: a simulated call that hangs.
                self._ledger.watching = False
                if self._stop.is_set():
                    return  # Shutting down: the error is how the wait was ended, not news.
                if str(err) != self._last_failure:
                    log.warning("XID events from NVML unavailable: %s; re-registering with backoff", err)
                    self._last_failure = str(err)
            except Exception:  # The thread must outlive any surprise from the library; it is logged.
                self._ledger.watching = False
                log.exception("XID watcher failed; re-registering with backoff")
            self._stop.wait(self._backoff.next())

    def _watch(self) -> None:
        nvml = self._nvml
        nvml.nvmlInit()
        event_set = None
        try:
            event_set = nvml.nvmlEventSetCreate()
            gpus = self._register(event_set)
            if not gpus:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._ledger.watching = True
            self._backoff.reset()
            if self._last_failure:
                log.info("XID events from NVML registered again for %d GPUs", len(gpus))
                self._last_failure = ""
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
                except pynvml.NVMLError as err:
                    if err.value == pynvml.NVML_ERROR_TIMEOUT:
                        continue
                    raise
                gpu = gpus.get(_handle_key(data.device))
                if gpu is None:
                    continue
                if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self._ledger.record_nvml(gpu[0], gpu[1], gpu[2], int(data.eventData))
                if data.eventType & pynvml.nvmlEventTypeGpuRecoveryAction:
                    self._record_verdict(data.device, gpu[1])
        finally:
            self._ledger.watching = False
            self._release(event_set)

    def _release(self, event_set: EventSet | None) -> None:
        """Free the event set and our NVML reference; after a driver loss both calls may fail, harmlessly."""
        try:
            if event_set is not None:
                self._nvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError:
            pass
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass

    def _record_verdict(self, handle: Handle, uuid: str) -> None:
        """Read the verdict the event announces from NVML's recovery-action field, which says what it is in the
        driver's own terms (what NVML puts in the event's own data for this type is not documented); a GPU that
        cannot answer now is left to the next collection."""
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST:
                raise
            return
        value = field_value(values[0]) if values else None
        if value is not None:
            self._ledger.record_verdict(uuid, int(value))

    def _events(self, handle: Handle) -> int:
        """The events to register a GPU for: critical XIDs, and its recovery action where the driver has it."""
        try:
            supported = self._nvml.nvmlDeviceGetSupportedEventTypes(handle)
        except pynvml.NVMLError as err:
            if err.value in _NO_LIBRARY:
                raise
            supported = 0  # The optional event must not cost the GPU its XIDs: registering them decides.
        return int(pynvml.nvmlEventTypeXidCriticalError | (supported & pynvml.nvmlEventTypeGpuRecoveryAction))

    def _register_gpu(self, handle: Handle, event_set: EventSet) -> None:
        """Register one GPU for its events; where the driver refuses the recovery action it said it had, for its
        XIDs alone."""
        events = self._events(handle)
        try:
            self._nvml.nvmlDeviceRegisterEvents(handle, events, event_set)
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_NOT_SUPPORTED or events == pynvml.nvmlEventTypeXidCriticalError:
                raise
            self._nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)

    def _register(self, event_set: EventSet) -> dict[int, tuple[int, str, str]]:
        """Register each GPU for critical XID events; a GPU that cannot be registered is skipped."""
        nvml = self._nvml
        gpus: dict[int, tuple[int, str, str]] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = as_text(nvml.nvmlDeviceGetUUID(handle))
                bus_id = as_text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                self._register_gpu(handle, event_set)
            except pynvml.NVMLError as err:
                if err.value in DRIVER_LOST:
                    raise
                log.info("GPU %d: XID events cannot be registered: %s", index, err)
                continue
            self._ledger.register_gpu(index, uuid, bus_id)
            gpus[_handle_key(handle)] = (index, uuid, bus_id)
        return gpus


class KernelLogXids:
    """XIDs from the kernel log (`Hardware.kernel_log`: /dev/kmsg, or the simulator's), read by the GPU collector at
    each collection and, while a collection hangs in NVML, at each of its ticks (`GpuCollector.held`): a driver
    that hangs delivers no NVML event, and its XID 119 or 120 reaches only the kernel log. Fatal NVSwitch errors
    (SXids) are taken from the same lines, as only the kernel log tells them, and hold the whole board. No thread
    of its own: a simulated fleet of a thousand nodes would need a thousand.

    It starts at the end of the log, so XIDs from before the exporter started are not counted again after every
    restart. A log it cannot read (no CAP_SYSLOG, no /dev/kmsg in a container) is said once in the exporter's log
    and in the kernel collector's `gpufleet_kernel_log_readable`, and tried again at each read.
    """

    def __init__(self, kernel_log: KernelLog, ledger: XidLedger) -> None:
        self._reader = kernel_log.reader()
        self._ledger = ledger
        self._unreadable = ""  # Why the log could not be read, as last logged.

    def start(self) -> None:
        self.poll()  # Positions the reader at the end of the log.

    def poll(self) -> None:
        """Count the XID lines logged since the last poll (through the ledger's de-duplication), and record the
        fatal SXids."""
        try:
            messages = self._reader.read()
        except OSError as err:
            reason = err.strerror or str(err)
            if reason != self._unreadable:
                log.warning("kernel log unreadable for XIDs: %s; only NVML's events are counted until it can be "
                            "read", reason)
                self._unreadable = reason
            return
        if self._unreadable:
            log.info("kernel log readable again for XIDs")
            self._unreadable = ""
        for message in messages:
            parsed = parse_xid_line(message)
            if parsed is not None:
                self._ledger.record_kmsg(*parsed)
            elif (sxid := parse_sxid(message)) is not None and sxid.error_class == "fatal":
                self._ledger.record_fatal_sxid(sxid)

    def close(self) -> None:
        self._reader.close()
