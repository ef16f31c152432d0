"""The NVML surface gpufleet calls, and the facts about it that its users share.

`Nvml` is that surface as a Protocol: the real `pynvml` module provides it in
production, and `SimulatedNvml` for `--gpu.backend=sim`, the simulator and the
tests. Because the session, the probes and the XID watcher accept only `Nvml`,
mypy checks the simulated library against every call the production code makes,
and a test checks each name against the installed nvidia-ml-py.

NVML errors fall into classes that each need a different answer (see
`exporter.gpu.session`); keeping the classes here means both users of NVML
agree on what "the driver is gone" means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import pynvml

# pynvml's ctypes pointers, or the simulator's objects: opaque to every caller.
Handle: TypeAlias = Any
EventSet: TypeAlias = Any
GpmSample: TypeAlias = Any  # pynvml's c_nvmlGpmSample_t: an opaque pointer the driver fills.
FieldRequest: TypeAlias = int | tuple[int, int]  # A field id, or (field id, scope such as an NVLink).


class PciInfo(Protocol):
    @property
    def busId(self) -> str | bytes: ...  # NVML's own field names throughout.


class Utilization(Protocol):
    @property
    def gpu(self) -> int: ...

    @property
    def memory(self) -> int: ...


class Memory(Protocol):
    """nvmlMemory_v2_t, or nvmlMemory_t where asked for version 0, which has no `reserved` and counts it in `used`."""

    @property
    def total(self) -> int: ...

    @property
    def used(self) -> int: ...

    @property
    def free(self) -> int: ...

    @property
    def reserved(self) -> int: ...


class ViolationTime(Protocol):
    @property
    def violationTime(self) -> int: ...  # nanoseconds (nvml.h: nvmlViolationTime_t).


class ProcessInfo(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...  # bytes; NVML_VALUE_NOT_AVAILABLE in some containers.


class FieldValue(Protocol):
    @property
    def nvmlReturn(self) -> int: ...

    @property
    def valueType(self) -> int: ...

    @property
    def value(self) -> Any: ...  # The union nvmlValue_t; `valueType` says which member holds the number.


class Sample(Protocol):
    @property
    def timeStamp(self) -> int: ...  # CPU time in microseconds.

    @property
    def sampleValue(self) -> Any: ...  # The union nvmlValue_t; the call returns the member's type.


class GpmSupport(Protocol):
    @property
    def isSupportedDevice(self) -> int: ...


class EventData(Protocol):
    @property
    def device(self) -> Handle: ...

    @property
    def eventType(self) -> int: ...

    @property
    def eventData(self) -> int: ...  # the XID code, for an XID event.


class Nvml(Protocol):
    """Every NVML function gpufleet calls, with pynvml's names and argument order (positional only)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Handle: ...
    def nvmlDeviceGetUUID(self, handle: Handle, /) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Handle, /) -> str | bytes: ...
    def nvmlDeviceGetSerial(self, handle: Handle, /) -> str | bytes: ...
    def nvmlDeviceGetVbiosVersion(self, handle: Handle, /) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Handle, /) -> PciInfo: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Handle, /) -> Utilization: ...
    # (nvmlValueType_t, the driver's samples newer than the time stamp); NOT_FOUND where there is none.
    def nvmlDeviceGetSamples(
        self, handle: Handle, sampling_type: int, time_stamp: int, /
    ) -> tuple[int, Sequence[Sample]]: ...
    def nvmlDeviceGetEncoderUtilization(self, handle: Handle, /) -> Sequence[int]: ...  # [percent, sampling period µs]
    def nvmlDeviceGetDecoderUtilization(self, handle: Handle, /) -> Sequence[int]: ...
    # version: pynvml.nvmlMemory_v2, or 0 for the first structure.
    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int, /) -> Memory: ...
    def nvmlDeviceGetPowerUsage(self, handle: Handle, /) -> int: ...  # milliwatts
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle, /) -> int: ...  # milliwatts
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Handle, /) -> int: ...  # milliwatts
    def nvmlDeviceGetPersistenceMode(self, handle: Handle, /) -> int: ...  # NVML_FEATURE_ENABLED or _DISABLED
    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int, /) -> int: ...  # °C
    def nvmlDeviceGetTemperatureThreshold(self, handle: Handle, threshold: int, /) -> int: ...  # °C
    def nvmlDeviceGetMarginTemperature(self, handle: Handle, /) -> int: ...  # °C
    def nvmlDeviceGetClockInfo(self, handle: Handle, clock_type: int, /) -> int: ...  # MHz
    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, clock_type: int, /) -> int: ...  # MHz
    def nvmlDeviceGetPerformanceState(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetNumFans(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetFanSpeed_v2(self, handle: Handle, fan: int, /) -> int: ...  # percent
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle, /) -> int: ...  # Its name before R535.
    def nvmlDeviceGetViolationStatus(self, handle: Handle, policy: int, /) -> ViolationTime: ...
    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int, /) -> int: ...
    # Fill the structure a `ctypes.byref` points to: c_nvmlGpuFabricInfo_v3_t or _v2_t, and the older call's
    # c_nvmlGpuFabricInfo_t.
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Handle, info: Any, /) -> int: ...
    def nvmlDeviceGetGpuFabricInfo(self, handle: Handle, info: Any, /) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: Handle, /) -> Sequence[int]: ...  # [current, pending]
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int, /) -> Handle: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Handle, /) -> int: ...  # Of a MIG device handle.
    def nvmlDeviceGetComputeInstanceId(self, handle: Handle, /) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Handle, link: int, counter: int, /) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle, /) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetFieldValues(self, handle: Handle, fields: Sequence[FieldRequest], /) -> Sequence[FieldValue]: ...
    def nvmlGpmQueryDeviceSupport(self, handle: Handle, /) -> GpmSupport: ...
    def nvmlGpmSampleAlloc(self) -> GpmSample: ...
    def nvmlGpmSampleFree(self, sample: GpmSample, /) -> None: ...
    def nvmlGpmSampleGet(self, handle: Handle, sample: GpmSample, /) -> GpmSample: ...
    def nvmlGpmMigSampleGet(self, handle: Handle, gpu_instance: int, sample: GpmSample, /) -> GpmSample: ...
    # Fills the metrics of pynvml's c_nvmlGpmMetricsGet_t, computed between its two samples.
    def nvmlGpmMetricsGet(self, request: Any, /) -> Any: ...
    def nvmlEventSetCreate(self) -> EventSet: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle, /) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: EventSet, /) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: EventSet, timeout_ms: int, /) -> EventData: ...
    def nvmlEventSetFree(self, event_set: EventSet, /) -> None: ...

UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
TRANSIENT = frozenset({pynvml.NVML_ERROR_NO_DATA, pynvml.NVML_ERROR_NOT_READY})
DEVICE_LOST = frozenset(
    {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_GPU_NOT_FOUND, pynvml.NVML_ERROR_RESET_REQUIRED}
)
DRIVER_LOST = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_UNKNOWN,
    }
)


def as_text(value: str | bytes) -> str:
    """NVML strings arrive as str from recent nvidia-ml-py and as bytes from older releases."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Backoff:
    """Exponential backoff for re-initialising NVML: a node mid-driver-reload is not hammered."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.delay = initial, maximum, initial

    def next(self) -> float:
        """The delay before the next attempt; each call doubles the one after, up to the maximum."""
        delay, self.delay = self.delay, min(self.delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial
