"""A simulated NVML library: the `pynvml` function surface over simulated GPUs.

`--gpu.backend=sim` puts this where `pynvml` would be, so the exporter's own
session, probes and collector run unchanged on a machine without a GPU. It
answers with pynvml's own error classes and structures, including
NOT_SUPPORTED for what the simulated board lacks (an SXM H100 has no fans), so
the support probing and error handling are exercised as on real hardware.

A GPU's readings are a function of time (`Load`), so two reads at the same
instant agree and counters such as energy never go backwards.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

import pynvml

_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuTelemetry:
    """What a GPU reports at one instant, in the units NVML's callers see after conversion."""

    utilization: float = 0.0
    memory_copy_utilization: float = 0.0
    encoder_utilization: float = 0.0
    decoder_utilization: float = 0.0
    memory_used_bytes: int = 0
    power_watts: float = 70.0
    energy_joules: float = 0.0
    temperature_celsius: float = 30.0
    memory_temperature_celsius: float = 35.0
    sm_clock_hertz: float = 345e6
    memory_clock_hertz: float = 2619e6
    performance_state: int = 0
    pcie_generation: int = 5
    pcie_width: int = 16
    fan_speed_ratios: tuple[float, ...] = ()


class Load(Protocol):
    def __call__(self, gpu: SimulatedGpu, seconds: float) -> GpuTelemetry:
        """Telemetry of `gpu` `seconds` after the simulated driver was loaded."""


@dataclass
class SimulatedGpu:
    """One simulated board. Defaults describe an H100 SXM5 80GB."""

    index: int
    uuid: str
    load: Load
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = ""
    pci_bus_id: str = ""
    vbios: str = "96.00.99.00.01"
    memory_total_bytes: int = 81559 * _MIB
    power_limit_watts: float = 700.0
    idle_power_watts: float = 70.0
    sm_clock_max_hertz: float = 1980e6
    memory_clock_max_hertz: float = 2619e6
    pcie_max_generation: int = 5
    pcie_max_width: int = 16
    thresholds_celsius: dict[int, int] = field(
        default_factory=lambda: {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
        }
    )
    # NVML function names (and "field:<id>") this board answers with NOT_SUPPORTED.
    unsupported: set[str] = field(
        default_factory=lambda: {"nvmlDeviceGetNumFans", "nvmlDeviceGetFanSpeed_v2"}
    )
    # Injected faults: NVML function name (or "*" for every call) -> NVML error code.
    errors: dict[str, int] = field(default_factory=dict)


def steady(telemetry: GpuTelemetry) -> Load:
    """A load that always reports the same telemetry: exact values for tests."""

    def load(gpu: SimulatedGpu, seconds: float) -> GpuTelemetry:
        return telemetry

    return load


class TrainingLoad:
    """A data-parallel training step: utilisation, power, clocks and temperature rise and fall together.

    Power follows `a + b sin(wt + phase)`, so the energy counter is its exact
    integral and stays monotonic at any sampling rate.
    """

    def __init__(self, seed: int, index: int, period_seconds: float = 120.0) -> None:
        rng = random.Random(f"{seed}:{index}")
        self.phase = rng.uniform(0, 2 * math.pi)
        self.omega = 2 * math.pi / period_seconds
        self.depth = rng.uniform(0.3, 0.45)

    def __call__(self, gpu: SimulatedGpu, seconds: float) -> GpuTelemetry:
        angle = self.omega * seconds + self.phase
        utilization = 0.5 + self.depth * math.sin(angle)
        swing = gpu.power_limit_watts * 0.9 - gpu.idle_power_watts
        mean_power = gpu.idle_power_watts + swing * 0.5
        power_amplitude = swing * self.depth
        energy = mean_power * seconds + power_amplitude / self.omega * (math.cos(self.phase) - math.cos(angle))
        temperature = 32.0 + 40.0 * utilization
        return GpuTelemetry(
            utilization=round(utilization, 2),
            memory_copy_utilization=round(utilization * 0.6, 2),
            memory_used_bytes=int(gpu.memory_total_bytes * (0.3 + 0.5 * utilization)),
            power_watts=mean_power + power_amplitude * math.sin(angle),
            energy_joules=energy,
            temperature_celsius=temperature,
            memory_temperature_celsius=temperature + 6.0,
            sm_clock_hertz=gpu.sm_clock_max_hertz * (0.7 + 0.3 * utilization),
            memory_clock_hertz=gpu.memory_clock_max_hertz,
            pcie_generation=gpu.pcie_max_generation,
            pcie_width=gpu.pcie_max_width,
        )


def simulated_gpus(count: int, seed: int = 0) -> list[SimulatedGpu]:
    """`count` H100s running a training load, with stable identities derived from the seed."""
    rng = random.Random(seed)
    gpus = []
    for index in range(count):
        uuid = "GPU-" + "-".join(
            "".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
        )
        gpus.append(
            SimulatedGpu(
                index=index,
                uuid=uuid,
                load=TrainingLoad(seed, index),
                serial=str(1650923000000 + rng.randrange(10**6)),
                pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            )
        )
    return gpus


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SimulatedNvml:
    """The subset of pynvml the exporter calls, answered from `SimulatedGpu` objects.

    Handles are the `SimulatedGpu` objects themselves. Calls before `nvmlInit`
    or after `nvmlShutdown` fail with UNINITIALIZED, as the real library does.
    """

    def __init__(self, gpus: list[SimulatedGpu], *, clock: Callable[[], float] = time.monotonic,
                 driver_version: str = "570.133.20", cuda_version: int | None = 12080) -> None:
        self.gpus = gpus
        self.clock = clock
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.init_error: int | None = None  # An NVML error code nvmlInit fails with, to simulate a missing driver.
        self._loaded_at = clock()
        self._initialised = 0
        self._lock = threading.Lock()

    # Library lifecycle -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
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
        """What a driver reload does to callers: open sessions die and counters restart from zero."""
        with self._lock:
            self._initialised = 0
            self._loaded_at = self.clock()

    def _system(self) -> None:
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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedGpu:
        self._system()
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        self._check(gpu, "nvmlDeviceGetHandleByIndex")
        return gpu

    # Per-device calls ---------------------------------------------------------------------------

    def _check(self, gpu: SimulatedGpu, function: str) -> None:
        self._system()
        code = gpu.errors.get(function, gpu.errors.get("*"))
        if code is not None:
            raise _error(code)
        if function in gpu.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _now(self, gpu: SimulatedGpu, function: str) -> GpuTelemetry:
        self._check(gpu, function)
        return gpu.load(gpu, self.clock() - self._loaded_at)

    def nvmlDeviceGetUUID(self, gpu: SimulatedGpu) -> str:
        self._check(gpu, "nvmlDeviceGetUUID")
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: SimulatedGpu) -> str:
        self._check(gpu, "nvmlDeviceGetName")
        return gpu.name

    def nvmlDeviceGetSerial(self, gpu: SimulatedGpu) -> str:
        self._check(gpu, "nvmlDeviceGetSerial")
        return gpu.serial

    def nvmlDeviceGetVbiosVersion(self, gpu: SimulatedGpu) -> str:
        self._check(gpu, "nvmlDeviceGetVbiosVersion")
        return gpu.vbios

    def nvmlDeviceGetPciInfo(self, gpu: SimulatedGpu) -> Any:
        self._check(gpu, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=gpu.pci_bus_id)

    def nvmlDeviceGetUtilizationRates(self, gpu: SimulatedGpu) -> Any:
        now = self._now(gpu, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=round(now.utilization * 100), memory=round(now.memory_copy_utilization * 100))

    def nvmlDeviceGetEncoderUtilization(self, gpu: SimulatedGpu) -> list[int]:
        return [round(self._now(gpu, "nvmlDeviceGetEncoderUtilization").encoder_utilization * 100), 167000]

    def nvmlDeviceGetDecoderUtilization(self, gpu: SimulatedGpu) -> list[int]:
        return [round(self._now(gpu, "nvmlDeviceGetDecoderUtilization").decoder_utilization * 100), 167000]

    def nvmlDeviceGetMemoryInfo(self, gpu: SimulatedGpu) -> Any:
        used = self._now(gpu, "nvmlDeviceGetMemoryInfo").memory_used_bytes
        return SimpleNamespace(total=gpu.memory_total_bytes, used=used, free=gpu.memory_total_bytes - used)

    def nvmlDeviceGetPowerUsage(self, gpu: SimulatedGpu) -> int:
        return round(self._now(gpu, "nvmlDeviceGetPowerUsage").power_watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: SimulatedGpu) -> int:
        self._check(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        return round(gpu.power_limit_watts * 1000)

    def nvmlDeviceGetTemperature(self, gpu: SimulatedGpu, sensor: int) -> int:
        return round(self._now(gpu, "nvmlDeviceGetTemperature").temperature_celsius)

    def nvmlDeviceGetTemperatureThreshold(self, gpu: SimulatedGpu, threshold: int) -> int:
        self._check(gpu, "nvmlDeviceGetTemperatureThreshold")
        if threshold not in gpu.thresholds_celsius:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.thresholds_celsius[threshold]

    def nvmlDeviceGetMarginTemperature(self, gpu: SimulatedGpu) -> int:
        now = self._now(gpu, "nvmlDeviceGetMarginTemperature")
        slowdown = gpu.thresholds_celsius[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]
        return slowdown - round(now.temperature_celsius)

    def nvmlDeviceGetClockInfo(self, gpu: SimulatedGpu, clock_type: int) -> int:
        now = self._now(gpu, "nvmlDeviceGetClockInfo")
        hertz = now.memory_clock_hertz if clock_type == pynvml.NVML_CLOCK_MEM else now.sm_clock_hertz
        return round(hertz / 1e6)

    def nvmlDeviceGetMaxClockInfo(self, gpu: SimulatedGpu, clock_type: int) -> int:
        self._check(gpu, "nvmlDeviceGetMaxClockInfo")
        hertz = gpu.memory_clock_max_hertz if clock_type == pynvml.NVML_CLOCK_MEM else gpu.sm_clock_max_hertz
        return round(hertz / 1e6)

    def nvmlDeviceGetPerformanceState(self, gpu: SimulatedGpu) -> int:
        return self._now(gpu, "nvmlDeviceGetPerformanceState").performance_state

    def nvmlDeviceGetNumFans(self, gpu: SimulatedGpu) -> int:
        return len(self._now(gpu, "nvmlDeviceGetNumFans").fan_speed_ratios)

    def nvmlDeviceGetFanSpeed_v2(self, gpu: SimulatedGpu, fan: int) -> int:
        return round(self._now(gpu, "nvmlDeviceGetFanSpeed_v2").fan_speed_ratios[fan] * 100)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: SimulatedGpu) -> int:
        return self._now(gpu, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: SimulatedGpu) -> int:
        return self._now(gpu, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: SimulatedGpu) -> int:
        self._check(gpu, "nvmlDeviceGetMaxPcieLinkGeneration")
        return gpu.pcie_max_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: SimulatedGpu) -> int:
        self._check(gpu, "nvmlDeviceGetMaxPcieLinkWidth")
        return gpu.pcie_max_width

    def nvmlDeviceGetFieldValues(self, gpu: SimulatedGpu, field_ids: list[int]) -> Any:
        now = self._now(gpu, "nvmlDeviceGetFieldValues")
        answers = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, round(now.memory_temperature_celsius)),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (
                pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(now.energy_joules * 1000)
            ),
        }
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, field_id in zip(values, field_ids, strict=True):
            slot.fieldId = field_id
            slot.timestamp = int(time.time() * 1e6)
            answer = answers.get(field_id)
            if answer is None or f"field:{field_id}" in gpu.unsupported:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.valueType = answer[0]
            if answer[0] == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                slot.value.uiVal = answer[1]
            else:
                slot.value.ullVal = answer[1]
        return values

