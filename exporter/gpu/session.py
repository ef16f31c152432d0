"""One NVML session: initialisation with backoff, support probing, and per-cycle sampling.

The session talks to anything with the `pynvml` function surface: the real
`pynvml` module in production, `SimulatedNvml` for `--gpu.backend=sim`, and
the test fakes. Everything above that surface is the production code path.

NVML errors are sorted into four kinds, because each needs a different answer:

* unsupported (NOT_SUPPORTED, FUNCTION_NOT_FOUND): the board cannot answer;
  found once at start, logged once, and the series is never exported;
* transient (NO_DATA, NOT_READY): skip the value this cycle, say nothing;
* device lost (GPU_IS_LOST, GPU_NOT_FOUND, RESET_REQUIRED): drop that GPU's
  series and reopen it on a later cycle, leaving the other GPUs alone;
* driver lost (UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH,
  UNKNOWN, ...): the whole session is gone; shut it down and re-initialise
  with exponential backoff so a node mid-driver-reload is not hammered.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from gpufleet.exporter.gpu.fabric import fabric_probe
from gpufleet.exporter.gpu.gpm import GRAPHICS_ACTIVE, GpmMetric, GpmReader
from gpufleet.exporter.gpu.mig import MigReader
from gpufleet.exporter.gpu.nvlink import nvlink_fields, nvlink_probes
from gpufleet.exporter.gpu.nvml import DEVICE_LOST, DRIVER_LOST, TRANSIENT, UNSUPPORTED, Backoff, as_text
from gpufleet.exporter.gpu.probes import (
    ECC_ENABLED,
    ECC_ERRORS,
    FIELDS,
    PROBES,
    UTILIZATION,
    Field,
    Probe,
    Reading,
    Tier,
    read_fields,
)
from gpufleet.exporter.gpu.utilization import Utilization, utilization_probe

log = logging.getLogger(__name__)
T = TypeVar("T")


class GpuUnavailable(Exception):
    """NVML cannot be used right now; the message says why, for the log and the operator."""


class _DeviceLost(Exception):
    pass


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str
    vbios: str


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None  # None where NVML cannot tell (it hides it in some containers).
    gpu_instance: int | None = None  # The MIG GPU instance it runs in, on a GPU in MIG mode.


@dataclass(frozen=True)
class GpuSample:
    identity: GpuIdentity
    readings: tuple[Reading, ...]
    processes: tuple[GpuProcess, ...] | None = None  # None where the GPU cannot list its processes.


@dataclass(frozen=True)
class NodeSample:
    driver_version: str
    cuda_version: str
    device_count: int
    gpus: tuple[GpuSample, ...]
    lost: tuple[GpuIdentity, ...]  # GPUs seen before that did not answer this time.
    problems: tuple[str, ...]


@dataclass
class _Device:
    index: int
    handle: Any = None
    identity: GpuIdentity | None = None
    probes: dict[Tier, tuple[Probe, ...]] = field(default_factory=dict)
    fields: dict[Tier, tuple[Field, ...]] = field(default_factory=dict)  # Each tier's fields, asked in one call.
    static_readings: tuple[Reading, ...] = ()
    lists_processes: bool = False
    gpm: GpmReader | None = None
    mig: MigReader | None = None
    utilization: Utilization | None = None  # The utilisation probe's state, told when GPM measures the same.
    unsupported: list[str] = field(default_factory=list)
    # The last readings of each tier read less often than every collection, served between its reads.
    kept: dict[Tier, tuple[Reading, ...]] = field(default_factory=dict)
    countdown: dict[Tier, int] = field(default_factory=dict)  # Collections until a tier is read again; 0: now.


def _gpu_instance(raw: int | None) -> int | None:
    """A process's MIG GPU instance; NVML answers 0xFFFFFFFF (or older bindings nothing) outside MIG mode."""
    return None if raw is None or raw == 0xFFFFFFFF else int(raw)


def _utilization_from(activity: list[Reading], readings: list[Reading]) -> list[Reading]:
    """The readings with utilisation taken from GPM's graphics activity: the share of time a kernel ran, over
    the interval since the last collection, which the driver's samples would have cost a call to average. Where
    GPM has no reading yet (the first collection after a GPU opens), the driver's last sample period stands."""
    graphics = next((r.value for r in activity if r.metric is GRAPHICS_ACTIVE), None)
    if graphics is None:
        return readings
    return [Reading(UTILIZATION, graphics) if r.metric is UTILIZATION else r for r in readings]


def cuda_version(raw: int) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    return f"{raw // 1000}.{raw % 1000 // 10}"


class NvmlSession:
    """Owns NVML for the GPU collector; every method runs in the collector's worker thread."""

    def __init__(self, nvml: Any, *, clock: Callable[[], float] = time.monotonic,
                 backoff_initial: float = 1.0, backoff_max: float = 60.0, gpm: tuple[GpmMetric, ...] = (),
                 slow_every: int = 1, counter_every: int = 1) -> None:
        self._nvml = nvml
        self._gpm = gpm  # The GPM metrics to read where a board supports GPM; none turns GPM off.
        # The slow and the counter tier are read at every this many collections. Counted rather than timed, so
        # that a collection the scheduler starts a moment early cannot put them off to the next.
        self._every = {Tier.SLOW: slow_every, Tier.COUNTER: counter_every}
        self._clock = clock
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._next_attempt = 0.0
        self._last_failure = ""
        self._devices: list[_Device] | None = None
        self._known: dict[int, GpuIdentity] = {}
        # The last versions NVML reported, kept through outages so metadata labels do not churn.
        self.driver_version = ""
        self.cuda_version = ""

    def sample(self) -> NodeSample:
        """Read every GPU once; raises GpuUnavailable when NVML as a whole cannot be used."""
        if self._devices is None:
            self._start()
        assert self._devices is not None
        problems: list[str] = []
        gpus: list[GpuSample] = []
        try:
            for device in self._devices:
                sample = self._sample_device(device, problems)
                if sample is not None:
                    gpus.append(sample)
        except pynvml.NVMLError as err:
            self._fail(f"NVML stopped answering: {err}")
        answered = {gpu.identity.index for gpu in gpus}
        lost = tuple(identity for index, identity in sorted(self._known.items()) if index not in answered)
        return NodeSample(
            self.driver_version, self.cuda_version, len(self._devices), tuple(gpus), lost, tuple(problems)
        )

    def known_gpus(self) -> tuple[GpuIdentity, ...]:
        """Every GPU this exporter has seen answer, also while NVML as a whole is down."""
        return tuple(identity for _, identity in sorted(self._known.items()))

    def close(self) -> None:
        if self._devices is not None:
            for device in self._devices:
                self._release_samples(device)
            self._devices = None
            self._shutdown()

    def _start(self) -> None:
        now = self._clock()
        if now < self._next_attempt:
            raise GpuUnavailable(self._last_failure)  # Same text as the failed attempt: logged once, not per tick.
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError as err:
            self._fail(f"NVML initialisation failed: {err}", shutdown=False)
        try:
            self.driver_version = as_text(self._nvml.nvmlSystemGetDriverVersion())
            self.cuda_version = self._optional(lambda: cuda_version(self._nvml.nvmlSystemGetCudaDriverVersion()))
            count = self._nvml.nvmlDeviceGetCount()
            if count == 0:
                self._fail("NVML found no GPUs")
            devices = [_Device(index) for index in range(count)]
            for device in devices:
                self._open(device, [])  # A GPU that does not open now is retried, and reported, by sample().
        except pynvml.NVMLError as err:
            self._fail(f"NVML initialisation failed: {err}")
        self._log_unsupported(devices)
        self._devices = devices
        self._backoff.reset()
        log.info("NVML initialised: driver %s, CUDA %s, %d GPUs", self.driver_version, self.cuda_version, count)

    def _fail(self, reason: str, shutdown: bool = True) -> None:
        """Give up on this session and schedule the next attempt with exponential backoff."""
        if shutdown:
            self._shutdown()
        self._devices = None
        self._last_failure = reason
        self._next_attempt = self._clock() + self._backoff.next()
        raise GpuUnavailable(reason)

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # The driver is already gone; there is nothing left to release.

    def _open(self, device: _Device, problems: list[str]) -> bool:
        """Get the handle, identity and supported probes of one GPU; False where it does not answer."""
        nvml = self._nvml
        opened = self._identify(device, problems)
        if opened is None:
            return False
        handle, identity, links = opened
        unsupported: list[str] = []
        probes, static = self._supported_probes(handle, links, unsupported)
        fields = self._supported_fields(handle, links, unsupported)
        gpm = (GpmReader(device.index, self._gpm) if self._gpm and self._answers(
            "GPM (nvmlGpmQueryDeviceSupport)", lambda: bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice),
            unsupported) else None)
        # Whether or not MIG is on now: it can be turned on at a reset.
        mig = (MigReader(device.index, gpm is not None) if self._answers(
            "MIG (nvmlDeviceGetMigMode)", lambda: bool(nvml.nvmlDeviceGetMigMode(handle)), unsupported) else None)
        device.lists_processes = self._lists_processes(handle, unsupported)
        device.handle = handle
        device.identity = identity
        device.probes = {tier: tuple(p for p in probes if p.tier is tier) for tier in Tier}
        device.fields = {tier: tuple(f for f in fields if f.tier is tier) for tier in Tier}
        device.static_readings = tuple(static)
        device.gpm = gpm
        device.mig = mig
        device.utilization = next((p.read for p in probes if isinstance(p.read, Utilization)), None)
        device.unsupported = unsupported
        device.kept, device.countdown = {}, dict.fromkeys(self._every, 0)
        self._known[device.index] = identity
        return True

    def _identify(self, device: _Device, problems: list[str]) -> tuple[Any, GpuIdentity, list[int]] | None:
        """One GPU's handle, identity and NVLinks; None, with the problem noted, where it does not answer."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
            pci = nvml.nvmlDeviceGetPciInfo(handle)
            identity = GpuIdentity(
                index=device.index,
                uuid=as_text(nvml.nvmlDeviceGetUUID(handle)),
                name=as_text(nvml.nvmlDeviceGetName(handle)),
                pci_bus_id=as_text(pci.busId),
                serial=self._optional(lambda: as_text(nvml.nvmlDeviceGetSerial(handle))),
                vbios=self._optional(lambda: as_text(nvml.nvmlDeviceGetVbiosVersion(handle))),
            )
            links = self._nvlinks(handle)
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST:
                raise
            problems.append(f"GPU {device.index}: cannot open: {err}")
            return None
        return handle, identity, links

    def _supported_probes(self, handle: Any, links: list[int],
                          unsupported: list[str]) -> tuple[list[Probe], list[Reading]]:
        """The probes the GPU answers (read every cycle), and the readings of the static ones, read once now."""
        probes: list[Probe] = []
        static: list[Reading] = []
        for probe in (utilization_probe(), *PROBES, fabric_probe(), *nvlink_probes(links)):
            try:
                readings = probe.read(self._nvml, handle)
            except pynvml.NVMLError as err:
                if err.value in UNSUPPORTED:
                    unsupported.append(probe.name)
                    continue
                if err.value in DRIVER_LOST:
                    raise
                readings = []  # Supported but failing now: keep probing it every cycle.
            if probe.static and readings:
                static.extend(readings)
            else:
                probes.append(probe)
        return probes, static

    def _supported_fields(self, handle: Any, links: list[int], unsupported: list[str]) -> list[Field]:
        """The field values the GPU answers, asked all at once as every cycle asks them."""
        fields: list[Field] = []
        try:
            for fld, value in read_fields(self._nvml, handle, (*FIELDS, *nvlink_fields(links))):
                if value is None:
                    unsupported.append(f"field {fld.field_id} ({fld.description})")
                else:
                    fields.append(fld)
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST:
                raise
            unsupported.append("nvmlDeviceGetFieldValues")
        return fields

    def _lists_processes(self, handle: Any, unsupported: list[str]) -> bool:
        """Whether the GPU lists its compute processes: one that fails for another reason is asked again."""
        try:
            self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST:
                raise
            if err.value in UNSUPPORTED:
                unsupported.append("nvmlDeviceGetComputeRunningProcesses")
                return False
        return True

    @staticmethod
    def _answers(source: str, has: Callable[[], bool], unsupported: list[str]) -> bool:
        """Whether a board has a feature read beside the probes (GPM, MIG), found once when the GPU opens; one it
        lacks or refuses is listed as unsupported, with NVML's reason where it gave more than "not supported"."""
        try:
            if has():
                return True
            unsupported.append(source)
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST:
                raise
            unsupported.append(source if err.value in UNSUPPORTED else f"{source}: {err}")
        return False

    def _release_samples(self, device: _Device) -> None:
        """Free the GPM samples of the GPU and of its MIG instances."""
        for reader in (device.gpm, device.mig):
            if reader is not None:
                reader.free(self._nvml)
        device.gpm = device.mig = None

    def _nvlinks(self, handle: Any) -> list[int]:
        """The NVLinks this GPU has: the ones whose state NVML answers for (none on PCIe boards)."""
        links = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                self._nvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as err:
                if err.value in DRIVER_LOST or err.value in DEVICE_LOST:
                    raise
                continue
            links.append(link)
        return links

    @staticmethod
    def _optional(read: Callable[[], str]) -> str:
        """Metadata some boards or drivers lack (serial, VBIOS, CUDA version): an empty label is honest."""
        try:
            return read()
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST or err.value in DEVICE_LOST:
                raise
            return ""

    @staticmethod
    def _log_unsupported(devices: list[_Device]) -> None:
        """One log line per unsupported source, naming the GPUs, instead of one per GPU and source."""
        by_source: dict[str, list[str]] = defaultdict(list)
        for device in devices:
            for source in dict.fromkeys(device.unsupported):  # A per-link field is one source for all links.
                by_source[source].append(str(device.index))
        for source, gpus in by_source.items():
            log.info("NVML %s is not supported on GPU %s; its series are left out", source, ", ".join(gpus))

    def _sample_device(self, device: _Device, problems: list[str]) -> GpuSample | None:
        if device.handle is None and not self._open(device, problems):
            return None
        assert device.identity is not None
        due = [Tier.FAST, *(tier for tier, left in device.countdown.items() if left <= 0)]
        processes = None
        from_gpm = device.gpm is not None and device.gpm.measures(GRAPHICS_ACTIVE)
        if device.utilization is not None:
            device.utilization.from_gpm = from_gpm
        try:
            read = self._read_tiers(device, due, problems)
            readings = read.pop(Tier.FAST)
            if device.gpm is not None:
                activity = self._guarded("GPM", device, problems, device.gpm.read, self._nvml, device.handle) or []
                readings = _utilization_from(activity, readings) if from_gpm else readings
                readings += activity
            if device.mig is not None:
                readings += self._guarded("MIG", device, problems, device.mig.read, self._nvml, device.handle) or []
            if device.lists_processes:
                processes = self._guarded("nvmlDeviceGetComputeRunningProcesses", device, problems,
                                          self._processes, device)
        except _DeviceLost as lost:
            self._release_samples(device)
            device.handle = None  # Reopen on a later cycle: a reset GPU comes back with a new handle.
            problems.append(f"GPU {device.index} ({device.identity.uuid}) is lost: {lost}")
            return None
        for tier, tier_readings in read.items():
            device.kept[tier], device.countdown[tier] = tuple(tier_readings), self._every[tier]
        for tier in device.countdown:
            device.countdown[tier] -= 1
        kept = tuple(reading for tier_readings in device.kept.values() for reading in tier_readings)
        return GpuSample(device.identity, tuple(readings) + kept + device.static_readings, processes)

    def _read_tiers(self, device: _Device, due: list[Tier], problems: list[str]) -> dict[Tier, list[Reading]]:
        """The probes and fields of each tier due at this collection."""
        read: dict[Tier, list[Reading]] = {}
        for tier in due:
            readings = read[tier] = []
            for probe in device.probes[tier]:
                readings += self._guarded(probe.name, device, problems, probe.read, self._nvml, device.handle) or []
            if device.fields[tier]:
                readings += self._guarded("nvmlDeviceGetFieldValues", device, problems, self._field_readings,
                                          device, device.fields[tier]) or []
        return read

    def _processes(self, device: _Device) -> tuple[GpuProcess, ...]:
        return tuple(
            GpuProcess(int(p.pid), p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None,
                       _gpu_instance(getattr(p, "gpuInstanceId", None)))
            for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(device.handle)
        )

    def _field_readings(self, device: _Device, fields: tuple[Field, ...]) -> list[Reading]:
        readings: list[Reading] = []
        for fld, value in read_fields(self._nvml, device.handle, fields):
            if value is not None:
                readings += fld.readings(value)
        if any(r.metric is ECC_ENABLED and r.value == 0 for r in readings):
            # With ECC off the counters hold nothing meaningful; zeros would read as "healthy".
            readings = [r for r in readings if r.metric is not ECC_ERRORS]
        return readings

    @staticmethod
    def _guarded(name: str, device: _Device, problems: list[str], read: Callable[..., T], *args: Any) -> T | None:
        """Run one read, sorting its NVML error into skip (None), problem (None), lost GPU or lost driver."""
        try:
            return read(*args)
        except pynvml.NVMLError as err:
            if err.value in DRIVER_LOST:
                raise
            if err.value in DEVICE_LOST:
                raise _DeviceLost(str(err)) from err
            if err.value not in UNSUPPORTED | TRANSIENT:
                problems.append(f"GPU {device.index}: {name}: {err}")
            return None
