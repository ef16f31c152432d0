"""A GPU's place in its NVSwitch fabric (HGX boards): whether the fabric manager has registered it, and how
healthy NVML says its fabric is, from `nvmlDeviceGetGpuFabricInfoV`.

A GPU whose registration is not complete cannot reach its peers over NVLink; jobs that need it fail at NCCL's
first collective. On a board with no fabric NVML answers NOT_SUPPORTED (or a state of not supported), and the
probe is dropped as every unsupported one is. Drivers before the versioned call have only
`nvmlDeviceGetGpuFabricInfo` (state and status); those before the third version of its structure have health
flags but no summary: the probe steps down once, on the first read that says so, and stays there.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from gpufleet import fabric
from gpufleet.exporter.gpu.nvml import Handle, Nvml
from gpufleet.exporter.gpu.probes import GpuMetric, Probe, Reading, Tier

STATE = GpuMetric("gpufleet_gpu_fabric_state", "The GPU's registration with the NVSwitch fabric manager (1 not "
                  "started, 2 in progress, 3 completed); absent on a board without a fabric.")
HEALTH = GpuMetric("gpufleet_gpu_fabric_health", "The GPU's NVSwitch fabric health once registered (1 healthy, "
                   "2 unhealthy, 3 limited capacity: NVML's summary, or from its health flags where the driver has "
                   "none; 4 the registration failed).")
_SUMMARIES = frozenset({pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
                        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY})  # gpufleet.fabric's 1 to 3.
# Health flags that, set (their TRUE value, 1), mean the fabric cannot carry the GPU's traffic as it should.
_FAULTS = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
           pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
           pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY)
_DEGRADED_BANDWIDTH = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
_FLAG_WIDTH = 0x3
_FLAG_TRUE = 1
# Each way to ask, newest first: the structure, and the call that fills it.
_VERSIONS: tuple[tuple[type[ctypes.Structure], Callable[[Nvml, Handle, Any], int]], ...] = (
    (pynvml.c_nvmlGpuFabricInfo_v3_t, lambda nvml, handle, info: nvml.nvmlDeviceGetGpuFabricInfoV(handle, info)),
    (pynvml.c_nvmlGpuFabricInfo_v2_t, lambda nvml, handle, info: nvml.nvmlDeviceGetGpuFabricInfoV(handle, info)),
    (pynvml.c_nvmlGpuFabricInfo_t, lambda nvml, handle, info: nvml.nvmlDeviceGetGpuFabricInfo(handle, info)),
)
_OLDER = frozenset({pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


def _flag(mask: int, shift: int) -> bool:
    return (mask >> shift) & _FLAG_WIDTH == _FLAG_TRUE


def health(info: Any) -> float:
    """Failed for a registration that completed with an error; otherwise the summary where the driver gives one,
    or unhealthy for a faulty route, limited capacity for degraded bandwidth alone, else healthy."""
    if info.status != pynvml.NVML_SUCCESS:
        return float(fabric.REGISTRATION_FAILED)
    summary = getattr(info, "healthSummary", pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED)
    if summary in _SUMMARIES:
        return float(summary)
    mask = getattr(info, "healthMask", 0)
    if any(_flag(mask, shift) for shift in _FAULTS):
        return float(fabric.UNHEALTHY)
    return float(fabric.LIMITED_CAPACITY if _flag(mask, _DEGRADED_BANDWIDTH) else fabric.HEALTHY)


class FabricInfo:
    """One GPU's fabric state and health. One per GPU: it remembers which version of the call its driver has."""

    def __init__(self) -> None:
        self._version = 0

    def __call__(self, nvml: Nvml, handle: Handle) -> list[Reading]:
        while True:
            structure, call = _VERSIONS[self._version]
            info = structure()  # The versioned structures set their own `version`.
            try:
                call(nvml, handle, ctypes.byref(info))
                break
            except pynvml.NVMLError as err:
                if err.value not in _OLDER or self._version == len(_VERSIONS) - 1:
                    raise
                self._version += 1
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # No fabric: dropped as unsupported.
        readings = [Reading(STATE, float(info.state))]
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            readings.append(Reading(HEALTH, health(info)))
        return readings


def fabric_probe() -> Probe:
    """Slow: the state changes at registration and on faults, and the alerts wait minutes before they fire."""
    return Probe("nvmlDeviceGetGpuFabricInfoV", FabricInfo(), tier=Tier.SLOW)
