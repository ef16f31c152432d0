"""A simulated NVML library: the `pynvml` function surface over simulated GPUs.

`--gpu.backend=sim` puts this where `pynvml` would be, so the exporter's own
session, probes and collector run unchanged on a machine without a GPU. It
answers with pynvml's own error classes and structures, including
NOT_SUPPORTED for what the simulated board lacks (an SXM H100 has no fans), so
the support probing and error handling are exercised as on real hardware.
Every answer is read from the boards of `simulated.board` at the library's clock.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpufleet.exporter.gpu.nvml import FieldRequest
from gpufleet.exporter.gpu.simulated.board import (
    MIB,
    GpmActivity,
    GpuTelemetry,
    SimulatedGpu,
    SimulatedMigDevice,
    nvlink_kib_for,
)


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


_NVLINK_COUNTER_NAMES = {
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
}
_NVLINK5_FIELDS = {pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: "symbol",
                   pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: "effective"}
_IDLE_BELOW = 0.05
# The simulated driver takes a utilisation sample every second and keeps the last 100 (real boards sample
# every 1/6 s to 1 s); each sample is the mean over its period, so their mean over an interval is exact.
SAMPLE_PERIOD_SECONDS = 1.0
SAMPLE_BUFFER = 100
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
# GPM metric id -> the activity share it reports (in percent, as NVML gives it), or the PCIe rate (in MiB/s).
_GPM_PERCENT: dict[int, Callable[[GpmActivity], float]] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: lambda a: a.graphics,
    pynvml.NVML_GPM_METRIC_SM_UTIL: lambda a: a.sm_active,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: lambda a: a.sm_occupancy,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: lambda a: a.tensor,
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: lambda a: a.tensor,  # Training in bf16: every tensor op is HMMA.
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: lambda a: 0.0,
    pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: lambda a: 0.0,
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: lambda a: 0.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: lambda a: a.dram,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: lambda a: a.fp16,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: lambda a: a.fp32,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: lambda a: a.fp64,
}
_GPM_PCIE: dict[int, Callable[[GpmActivity], float]] = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: lambda a: a.pcie_transmit_bytes_per_second,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: lambda a: a.pcie_receive_bytes_per_second,
}
_GPM_NVLINK = frozenset({pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
                         pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC})


# What the simulated calls return: plain objects with the attributes of pynvml's ctypes structures,
# which are slow to build and read when a thousand simulated nodes ask for them.


@dataclass(slots=True)
class _PciInfo:
    busId: str  # NVML's field names, as in exporter.gpu.nvml.


@dataclass(slots=True)
class _Utilization:
    gpu: int
    memory: int


@dataclass(slots=True)
class _Memory:
    total: int
    used: int
    free: int
    reserved: int  # Only in the second version's structure; the first counts it in `used`.


@dataclass(slots=True)
class _ViolationTime:
    referenceTime: int
    violationTime: int


@dataclass(slots=True)
class _ProcessInfo:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(slots=True)
class _Value:
    """nvmlValue_t: a union, of which the simulated fields fill only the two members they use."""

    uiVal: int = 0
    ullVal: int = 0


@dataclass(slots=True)
class _Sample:
    timeStamp: int
    sampleValue: _Value


@dataclass(slots=True)
class _FieldValue:
    fieldId: int
    scopeId: int
    timestamp: int
    nvmlReturn: int
    valueType: int = 0
    latencyUsec: int = 0
    value: _Value = field(default_factory=_Value)


@dataclass(slots=True)
class _GpmSupport:
    version: int
    isSupportedDevice: int


@dataclass(slots=True)
class _GpmSnapshot:
    """What a GPM sample holds: the board (and MIG GPU instance), when it was taken, and the NVLink bytes counted
    by then."""

    gpu: SimulatedGpu | None = None
    generation: int = -1
    at: float = 0.0
    nvlink_kib: int = 0
    gpu_instance: int | None = None


@dataclass(frozen=True, eq=False)
class _Handle:
    """A device handle: valid only for the driver generation that issued it, as after a real reload."""

    gpu: SimulatedGpu
    generation: int


@dataclass(frozen=True, eq=False)
class _MigHandle(_Handle):
    """A MIG device's handle: the board's calls that take one answer for the MIG device."""

    device: SimulatedMigDevice


@dataclass(slots=True)
class _Event:
    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class _EventSet:
    """An NVML event set: the events queued for the GPUs registered with it."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        # GPU index -> the handle it was registered with, and the event types it was registered for.
        self.handles: dict[int, tuple[_Handle, int]] = {}
        self.queue: deque[_Event] = deque()
        self.ready = threading.Condition()


class SimulatedNvml:
    """The subset of pynvml the exporter calls, answered from `SimulatedGpu` objects.

    Calls before `nvmlInit`, after `nvmlShutdown`, or with a handle obtained
    before a driver reload fail with UNINITIALIZED, as the real library does.
    """

    def __init__(self, gpus: list[SimulatedGpu], *, clock: Callable[[], float] = time.monotonic,
                 driver_version: str = "570.133.20", cuda_version: int | None = 12080) -> None:
        self.gpus = gpus
        self.clock = clock
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.init_error: int | None = None  # An NVML error code nvmlInit fails with, to simulate a missing driver.
        # A hung driver: every call would block past any collector's timeout. The simulator, which collects its
        # nodes in one thread, cannot wait for that: each call raises TimeoutError at once, as the scheduler would
        # have given up on it. XID events are not delivered meanwhile.
        self.hung = False
        self._loaded_at = clock()
        self._initialised = 0
        self._generation = 0  # Bumped by a driver reload: event sets from before it stop working.
        self._event_sets: list[_EventSet] = []
        # GPM samples are pynvml's own opaque pointers, as the exporter passes them in NVML's request structure;
        # each points at a buffer of ours, and its address finds what the sample holds.
        self._gpm_samples: dict[int, tuple[ctypes.Array[ctypes.c_char], _GpmSnapshot]] = {}
        self._lock = threading.Lock()

    # Library lifecycle -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._answer()
        if self.init_error is not None:
            raise _error(self.init_error)
        with self._lock:
            self._initialised += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._initialised == 0:
                raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
            self._initialised -= 1

    def reload_driver(self) -> None:
        """What a driver reload does to callers: open sessions and event sets die, counters restart from zero."""
        with self._lock:
            self._initialised = 0
            self._loaded_at = self.clock()
            self._generation += 1
            event_sets = list(self._event_sets)
        for event_set in event_sets:
            with event_set.ready:
                event_set.ready.notify_all()

    def inject_xid(self, index: int, xid: int) -> None:
        """Raise a critical XID event on GPU `index`, as the driver would."""
        self._raise_event(index, pynvml.nvmlEventTypeXidCriticalError, xid)

    def set_recovery_action(self, index: int, action: int) -> None:
        """Give GPU `index` the driver's recovery action, raising its event when it changes on a board whose
        driver has one."""
        gpu = next(g for g in self.gpus if g.index == index)
        if gpu.recovery_action == action:
            return
        gpu.recovery_action = action
        if self._has_recovery_action(gpu):
            self._raise_event(index, pynvml.nvmlEventTypeGpuRecoveryAction, 0)

    def _raise_event(self, index: int, event_type: int, data: int) -> None:
        if self.hung:
            return
        with self._lock:
            event_sets = [e for e in self._event_sets if e.handles.get(index, (None, 0))[1] & event_type
                          and e.generation == self._generation]
        for event_set in event_sets:
            with event_set.ready:
                event_set.queue.append(_Event(event_set.handles[index][0], event_type, data))
                event_set.ready.notify_all()

    @staticmethod
    def _has_recovery_action(gpu: SimulatedGpu) -> bool:
        return f"field:{pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION}" not in gpu.unsupported

    @classmethod
    def _supported_events(cls, gpu: SimulatedGpu) -> int:
        recovery = pynvml.nvmlEventTypeGpuRecoveryAction if cls._has_recovery_action(gpu) else 0
        return int(pynvml.nvmlEventTypeXidCriticalError | recovery)

    # Events --------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._system()
        with self._lock:
            event_set = _EventSet(self._generation)
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        return self._supported_events(self._check(handle, "nvmlDeviceGetSupportedEventTypes"))

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        gpu = self._check(handle, "nvmlDeviceRegisterEvents")
        if event_types & ~self._supported_events(gpu):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # As NVML answers a mask with a type the GPU lacks.
        event_set.handles[gpu.index] = (handle, event_types)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> _Event:
        deadline = time.monotonic() + timeout_ms / 1000
        with event_set.ready:
            while not event_set.queue:
                if event_set.generation != self._generation:
                    raise _error(pynvml.NVML_ERROR_UNKNOWN)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _error(pynvml.NVML_ERROR_TIMEOUT)
                event_set.ready.wait(remaining)
            return event_set.queue.popleft()

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        with self._lock:
            if event_set in self._event_sets:
                self._event_sets.remove(event_set)

    def _answer(self) -> None:
        if self.hung:
            raise TimeoutError("the simulated NVIDIA driver hangs: the call never returns")

    def _system(self) -> None:
        self._answer()
        if not self._initialised:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system()
        if self.cuda_version is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._system()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._system()
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(self.gpus[index], self._generation)
        self._check(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    # Per-device calls ---------------------------------------------------------------------------

    def _check(self, handle: _Handle, function: str) -> SimulatedGpu:
        """The board behind a handle, after the checks the real library makes, and the injected faults.

        A simulated node makes about a thousand calls a collection: the injected errors are looked up only on
        a board that has some.
        """
        self._system()
        if handle.generation != self._generation:  # A handle from before a driver reload is dead.
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = handle.gpu
        if gpu.errors and (code := gpu.errors.get(function, gpu.errors.get("*"))) is not None:
            raise _error(code)
        if function in gpu.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _now(self, handle: _Handle, function: str) -> tuple[SimulatedGpu, GpuTelemetry]:
        gpu = self._check(handle, function)
        return gpu, gpu.load(gpu, self.clock() - self._loaded_at)

    def _telemetry(self, handle: _Handle, function: str) -> GpuTelemetry:
        return self._now(handle, function)[1]

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._check(handle, "nvmlDeviceGetUUID")
        return handle.device.uuid if isinstance(handle, _MigHandle) else gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        gpu = self._check(handle, "nvmlDeviceGetName")
        return f"{gpu.name} MIG {handle.device.profile}" if isinstance(handle, _MigHandle) else gpu.name

    def nvmlDeviceGetSerial(self, handle: _Handle) -> str:
        gpu = self._check(handle, "nvmlDeviceGetSerial")
        return gpu.serial

    def nvmlDeviceGetVbiosVersion(self, handle: _Handle) -> str:
        gpu = self._check(handle, "nvmlDeviceGetVbiosVersion")
        return gpu.vbios

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:
        gpu = self._check(handle, "nvmlDeviceGetPciInfo")
        return _PciInfo(gpu.pci_bus_id)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        now = self._telemetry(handle, "nvmlDeviceGetUtilizationRates")
        return _Utilization(round(now.utilization * 100), round(now.memory_copy_utilization * 100))

    def nvmlDeviceGetSamples(self, handle: _Handle, sampling_type: int, time_stamp: int) -> tuple[int, list[_Sample]]:
        """GPU utilisation samples newer than `time_stamp` (microseconds of the NVML clock), as the driver keeps
        them: one per `SAMPLE_PERIOD_SECONDS` since the driver was loaded, at most `SAMPLE_BUFFER`."""
        gpu = self._check(handle, "nvmlDeviceGetSamples")
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = self.clock()
        last = math.floor(now / SAMPLE_PERIOD_SECONDS)
        first = max(math.floor(self._loaded_at / SAMPLE_PERIOD_SECONDS) + 1, last - SAMPLE_BUFFER + 1,
                    math.floor(time_stamp / 1e6 / SAMPLE_PERIOD_SECONDS) + 1)
        samples = []
        for tick in range(first, last + 1):
            end = tick * SAMPLE_PERIOD_SECONDS
            if gpu.busy is not None:
                share = gpu.busy(end - SAMPLE_PERIOD_SECONDS, end)
            else:
                share = gpu.load(gpu, end - self._loaded_at).utilization
            samples.append(_Sample(round(end * 1e6), _Value(uiVal=round(100 * min(1.0, max(0.0, share))))))
        if not samples:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _UINT, samples

    def nvmlDeviceGetEncoderUtilization(self, handle: _Handle) -> list[int]:
        return [round(self._telemetry(handle, "nvmlDeviceGetEncoderUtilization").encoder_utilization * 100), 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: _Handle) -> list[int]:
        return [round(self._telemetry(handle, "nvmlDeviceGetDecoderUtilization").decoder_utilization * 100), 167000]

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int) -> _Memory:
        gpu, now = self._now(handle, "nvmlDeviceGetMemoryInfo" if not version else "nvmlDeviceGetMemoryInfo_v2")
        total, used, reserved = gpu.memory_total_bytes, now.memory_used_bytes, gpu.memory_reserved_bytes
        if isinstance(handle, _MigHandle):  # An instance with a process in it fills its share as the load says.
            busy = any(p.gpu_instance == handle.device.gpu_instance for p in gpu.processes)
            total, reserved = handle.device.memory_total_bytes, 0
            used = int(total * now.memory_used_bytes / gpu.memory_total_bytes) if busy else 0
        free = total - used - reserved
        if not version:  # nvmlMemory_t: "Sum of Reserved and Allocated device memory".
            return _Memory(total=total, used=used + reserved, free=free, reserved=0)
        return _Memory(total=total, used=used, free=free, reserved=reserved)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return round(self._telemetry(handle, "nvmlDeviceGetPowerUsage").power_watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        gpu = self._check(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return round(gpu.power_limit_watts * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:
        gpu = self._check(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        default = gpu.power_limit_watts if gpu.power_limit_default_watts is None else gpu.power_limit_default_watts
        return round(default * 1000)

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._check(handle, "nvmlDeviceGetPersistenceMode").persistence_mode

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return round(self._telemetry(handle, "nvmlDeviceGetTemperature").temperature_celsius)

    def nvmlDeviceGetTemperatureThreshold(self, handle: _Handle, threshold: int) -> int:
        gpu = self._check(handle, "nvmlDeviceGetTemperatureThreshold")
        if threshold not in gpu.thresholds_celsius:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.thresholds_celsius[threshold]

    def nvmlDeviceGetMarginTemperature(self, handle: _Handle) -> int:
        gpu, now = self._now(handle, "nvmlDeviceGetMarginTemperature")
        slowdown = gpu.thresholds_celsius[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]
        return slowdown - round(now.temperature_celsius)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        _gpu, now = self._now(handle, "nvmlDeviceGetClockInfo")
        hertz = now.memory_clock_hertz if clock_type == pynvml.NVML_CLOCK_MEM else now.sm_clock_hertz
        return round(hertz / 1e6)

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock_type: int) -> int:
        gpu = self._check(handle, "nvmlDeviceGetMaxClockInfo")
        hertz = gpu.memory_clock_max_hertz if clock_type == pynvml.NVML_CLOCK_MEM else gpu.sm_clock_max_hertz
        return round(hertz / 1e6)

    def nvmlDeviceGetPerformanceState(self, handle: _Handle) -> int:
        return self._telemetry(handle, "nvmlDeviceGetPerformanceState").performance_state

    def nvmlDeviceGetNumFans(self, handle: _Handle) -> int:
        return len(self._telemetry(handle, "nvmlDeviceGetNumFans").fan_speed_ratios)

    def nvmlDeviceGetFanSpeed_v2(self, handle: _Handle, fan: int) -> int:
        return round(self._telemetry(handle, "nvmlDeviceGetFanSpeed_v2").fan_speed_ratios[fan] * 100)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._telemetry(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._telemetry(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        gpu = self._check(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
        return gpu.pcie_max_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        gpu = self._check(handle, "nvmlDeviceGetMaxPcieLinkWidth")
        return gpu.pcie_max_width

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        gpu, now = self._now(handle, "nvmlDeviceGetComputeRunningProcesses")
        if not gpu.processes:
            return []
        # The driver keeps about 500 MiB per context for itself; the rest is split between the processes.
        share = max(0, now.memory_used_bytes - 512 * MIB) // len(gpu.processes)
        outside = 0xFFFFFFFF  # What NVML answers for the instance ids of a process outside MIG.
        return [_ProcessInfo(p.pid, share, outside if p.gpu_instance is None else p.gpu_instance,
                             outside if p.gpu_instance is None else 0) for p in gpu.processes]

    # MIG ----------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._check(handle, "nvmlDeviceGetMigMode")
        current = gpu.mig is not None
        pending = current if gpu.mig_pending is None else gpu.mig_pending
        return [int(current), int(pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _MigHandle:
        gpu = self._check(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if gpu.mig is None or not 0 <= index < 7:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _MigHandle(gpu, handle.generation, gpu.mig[index])

    def _mig_device(self, handle: _Handle, function: str) -> SimulatedMigDevice:
        self._check(handle, function)
        if not isinstance(handle, _MigHandle):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.device

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        return self._mig_device(handle, "nvmlDeviceGetGpuInstanceId").gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        return self._mig_device(handle, "nvmlDeviceGetComputeInstanceId").compute_instance

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        gpu, now = self._now(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        idle = pynvml.nvmlClocksEventReasonGpuIdle if now.utilization < _IDLE_BELOW else 0
        return gpu.clock_events | idle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        """The same mask under its name before R535, for callers written against older drivers."""
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetViolationStatus(self, handle: _Handle, policy: int) -> _ViolationTime:
        gpu = self._check(handle, "nvmlDeviceGetViolationStatus")
        seconds = gpu.violation_seconds.get(policy, 0.0)
        return _ViolationTime(referenceTime=int(time.time() * 1e6), violationTime=int(seconds * 1e9))

    def _link(self, handle: _Handle, function: str, link: int) -> SimulatedGpu:
        gpu = self._check(handle, function)
        if gpu.nvlinks == 0:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlinks:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._link(handle, "nvmlDeviceGetNvLinkState", link)
        state: int = pynvml.NVML_FEATURE_DISABLED if link in gpu.nvlinks_down else pynvml.NVML_FEATURE_ENABLED
        return state

    def nvmlDeviceGetGpuFabricInfoV(self, handle: _Handle, info: Any) -> int:
        """Fills the structure `info` (a ctypes.byref) points to, as far as its version has fields."""
        gpu = self._check(handle, "nvmlDeviceGetGpuFabricInfoV")
        target = info._obj
        known = {pynvml.nvmlGpuFabricInfo_v2: 2, pynvml.nvmlGpuFabricInfo_v3: 3}.get(target.version)
        if known is None or known > gpu.fabric_info_version:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_fabric(gpu, target)
        target.healthMask = gpu.fabric_health_mask
        if target.version == pynvml.nvmlGpuFabricInfo_v3:
            target.healthSummary = gpu.fabric_health_summary
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuFabricInfo(self, handle: _Handle, info: Any) -> int:
        self._fill_fabric(self._check(handle, "nvmlDeviceGetGpuFabricInfo"), info._obj)
        return int(pynvml.NVML_SUCCESS)

    @staticmethod
    def _fill_fabric(gpu: SimulatedGpu, target: Any) -> None:
        target.state = gpu.fabric_state
        target.status = gpu.fabric_status
        target.cliqueId = 1 if gpu.fabric_state else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        gpu = self._link(handle, "nvmlDeviceGetNvLinkErrorCounter", link)
        return gpu.nvlink_errors.get((link, _NVLINK_COUNTER_NAMES[counter]), 0)

    def _field_answers(self, gpu: SimulatedGpu, now: GpuTelemetry) -> dict[int, tuple[int, int]]:
        ecc = gpu.ecc_errors
        return {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (_UINT, round(now.memory_temperature_celsius)),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (_ULL, int(now.energy_joules * 1000)),
            pynvml.NVML_FI_DEV_ECC_CURRENT: (_UINT, gpu.ecc_mode),
            pynvml.NVML_FI_DEV_ECC_PENDING: (_UINT, gpu.ecc_pending_mode),
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (_ULL, ecc.get(("corrected", "volatile"), 0)),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (_ULL, ecc.get(("uncorrected", "volatile"), 0)),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (_ULL, ecc.get(("corrected", "aggregate"), 0)),
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (_ULL, ecc.get(("uncorrected", "aggregate"), 0)),
            pynvml.NVML_FI_DEV_REMAPPED_COR: (_UINT, gpu.remapped_rows.get("correctable", 0)),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: (_UINT, gpu.remapped_rows.get("uncorrectable", 0)),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: (_UINT, int(gpu.row_remap_pending)),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (_UINT, int(gpu.row_remap_failed)),
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (_UINT, gpu.recovery_action),
            pynvml.NVML_FI_DEV_RETIRED_SBE: (_ULL, gpu.retired_pages.get("single_bit", 0)),
            pynvml.NVML_FI_DEV_RETIRED_DBE: (_ULL, gpu.retired_pages.get("double_bit", 0)),
            pynvml.NVML_FI_DEV_RETIRED_PENDING: (_UINT, int(gpu.retired_pages_pending)),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (_ULL, gpu.pcie_replays),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: (_ULL, gpu.pcie_replay_rollovers),
            pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL: (_ULL, gpu.nvlink_ecc_errors),
        }

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: Sequence[FieldRequest]) -> list[_FieldValue]:
        gpu, now = self._now(handle, "nvmlDeviceGetFieldValues")
        answers = self._field_answers(gpu, now)
        nvlink_kib = nvlink_kib_for(now.energy_joules)
        stamp = int(time.time() * 1e6)
        refused = gpu.unsupported
        values = []
        for requested in field_ids:
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            if field_id in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                answer = (_ULL, gpu.nvlink_stopped_kib.get(scope, nvlink_kib)) if scope < gpu.nvlinks else None
            elif field_id in _NVLINK5_FIELDS:
                answer = ((_ULL, gpu.nvlink_errors.get((scope, _NVLINK5_FIELDS[field_id]), 0))
                          if gpu.nvlink_generation >= 5 and scope < gpu.nvlinks else None)
            else:
                answer = answers.get(field_id)
            if answer is None or (refused and f"field:{field_id}" in refused):
                values.append(_FieldValue(field_id, scope, stamp, pynvml.NVML_ERROR_NOT_SUPPORTED))
                continue
            value_type, number = answer
            values.append(_FieldValue(field_id, scope, stamp, pynvml.NVML_SUCCESS, value_type,
                                      value=_Value(uiVal=number) if value_type == _UINT else _Value(ullVal=number)))
        return values


    # GPU Performance Monitoring -----------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> _GpmSupport:
        gpu = self._check(handle, "nvmlGpmQueryDeviceSupport")
        return _GpmSupport(pynvml.NVML_GPM_SUPPORT_VERSION, int(gpu.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._system()
        buffer = ctypes.create_string_buffer(8)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm_samples[ctypes.addressof(buffer)] = (buffer, _GpmSnapshot())
        return sample

    def _gpm_snapshot(self, sample: Any) -> _GpmSnapshot:
        found = self._gpm_samples.get(ctypes.cast(sample, ctypes.c_void_p).value or 0)
        if found is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found[1]

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._gpm_snapshot(sample)
        with self._lock:
            del self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value or 0]

    def nvmlGpmSampleGet(self, handle: _Handle, sample: Any) -> Any:
        """A whole-GPU sample. In MIG mode the simulated board refuses it and answers per instance: whether real
        boards answer both is not documented, and the exporter reads whichever answers."""
        gpu, now = self._now(handle, "nvmlGpmSampleGet")
        if not gpu.gpm_supported or gpu.mig is not None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        snapshot = self._gpm_snapshot(sample)
        kib = nvlink_kib_for(now.energy_joules)
        snapshot.gpu, snapshot.generation, snapshot.at = gpu, self._generation, self.clock()
        snapshot.gpu_instance = None
        stopped = [value for link, value in gpu.nvlink_stopped_kib.items() if link < gpu.nvlinks]
        snapshot.nvlink_kib = kib * (gpu.nvlinks - len(stopped)) + sum(stopped)
        return sample

    def nvmlGpmMigSampleGet(self, handle: _Handle, gpu_instance: int, sample: Any) -> Any:
        gpu = self._check(handle, "nvmlGpmMigSampleGet")
        if not gpu.gpm_supported or gpu.mig is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if all(device.gpu_instance != gpu_instance for device in gpu.mig):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        snapshot = self._gpm_snapshot(sample)
        snapshot.gpu, snapshot.generation, snapshot.at = gpu, self._generation, self.clock()
        snapshot.nvlink_kib, snapshot.gpu_instance = 0, gpu_instance
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """Each requested metric between the request's two samples, as the driver computes it from its counters."""
        self._system()
        first, second = self._gpm_snapshot(request.sample1), self._gpm_snapshot(request.sample2)
        gpu = second.gpu
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if (gpu is None or first.gpu is not gpu or first.generation != self._generation
                or second.generation != self._generation or second.at < first.at
                or first.gpu_instance != second.gpu_instance):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        seconds = second.at - first.at
        if seconds == 0:  # Two samples of one instant (a frozen simulated clock) measure nothing.
            for index in range(request.numMetrics):
                request.metrics[index].nvmlReturn = pynvml.NVML_ERROR_NO_DATA
            return request
        if gpu.activity is not None:
            activity = gpu.activity(first.at, second.at)
        else:
            activity = GpmActivity.of_utilization(gpu.load(gpu, second.at - self._loaded_at).utilization)
        if second.gpu_instance is not None and all(p.gpu_instance != second.gpu_instance for p in gpu.processes):
            activity = GpmActivity()  # A MIG instance with nothing running in it does nothing.
        refused = {name for name in gpu.unsupported if name.startswith("gpm:")}
        for metric in request.metrics[:request.numMetrics]:
            metric_id = metric.metricId
            if refused and f"gpm:{metric_id}" in refused:
                value = None
            elif metric_id in _GPM_PERCENT:
                value = 100.0 * min(1.0, max(0.0, _GPM_PERCENT[metric_id](activity)))
            elif metric_id in _GPM_PCIE:
                value = _GPM_PCIE[metric_id](activity) / MIB
            elif metric_id in _GPM_NVLINK:
                value = (second.nvlink_kib - first.nvlink_kib) * 1024 / seconds / MIB
            else:
                value = None
            metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else pynvml.NVML_SUCCESS
            metric.value = 0.0 if value is None else value
        return request
