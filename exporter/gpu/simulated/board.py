"""The simulated GPU boards: what each board is (identity, limits, health) and what it reads over time.

A GPU's readings are a function of time (`Load`), so two reads at the same
instant agree and counters such as energy never go backwards. The NVML facade
(`simulated.nvml`) answers pynvml's calls from these boards; the fleet simulator
sets their health fields to inject faults.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pynvml

MIB = 1024 * 1024


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


@dataclass(slots=True)
class GpmActivity:
    """What the SMs, tensor pipes and DRAM did over an interval, as shares of it, and the GPU's PCIe traffic.

    A training step's compute keeps most SMs and the tensor pipes busy; its collectives, and NCCL spinning
    while it waits for a late peer, keep a kernel running (NVML utilisation stays high) on a few SMs with
    the tensor pipes idle. The rest follows from the SMs' and tensor pipes' activity in that spirit:
    occupancy and non-tensor math follow the SMs, PCIe input follows the math (batches fed to it).
    """

    sm_active: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    graphics: float = 0.0  # The share of time a kernel ran, as GPM counts it: NVML utilisation's measure.

    @classmethod
    def of_utilization(cls, utilization: float) -> GpmActivity:
        """A busy board without a phase model (`steady`, `TrainingLoad`): kernels that do math most of the time."""
        return cls(0.9 * utilization, 0.6 * utilization, 0.5 * utilization, utilization)

    @property
    def sm_occupancy(self) -> float:
        return 0.55 * self.sm_active

    @property
    def fp16(self) -> float:
        return 0.04 * self.sm_active

    @property
    def fp32(self) -> float:
        return 0.1 * self.sm_active

    @property
    def fp64(self) -> float:
        return 0.0  # Training in bf16 does no double-precision math.

    @property
    def pcie_transmit_bytes_per_second(self) -> float:
        return 0.4e9 * self.tensor

    @property
    def pcie_receive_bytes_per_second(self) -> float:
        return 2.5e9 * self.tensor


@dataclass(frozen=True)
class SimulatedProcess:
    """A process on a simulated GPU, with the cgroup path its `/proc/<pid>/cgroup` file names, and the MIG GPU
    instance it runs in on a GPU in MIG mode."""

    pid: int
    cgroup: str
    gpu_instance: int | None = None


@dataclass(frozen=True)
class SimulatedMigDevice:
    """A MIG device: one compute instance of a GPU instance, with the instance's profile and memory."""

    gpu_instance: int
    compute_instance: int
    profile: str  # As nvidia-smi names it: 1g.10gb, 3g.40gb, 7g.80gb.
    memory_total_bytes: int
    uuid: str


class Load(Protocol):
    def __call__(self, gpu: SimulatedGpu, seconds: float, /) -> GpuTelemetry:
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
    memory_total_bytes: int = 81559 * MIB
    memory_reserved_bytes: int = 0  # Set aside by the driver: a board of an older driver that cannot tell it lists
    # nvmlDeviceGetMemoryInfo_v2 in `unsupported`.
    power_limit_watts: float = 700.0  # What the driver enforces, which an operator may set below the default.
    power_limit_default_watts: float | None = None  # None: the limit it enforces.
    persistence_mode: int = pynvml.NVML_FEATURE_ENABLED
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
    # Health state, changed by fault injection; counters only ever grow.
    ecc_mode: int = 1
    ecc_pending_mode: int = 1
    ecc_errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (error, scope) -> count
    remapped_rows: dict[str, int] = field(default_factory=dict)  # cause -> rows
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    recovery_action: int = 0  # What the driver asks for (NVML's nvmlGpuRecoveryAction_t); boards of older drivers
    # list `field:230` in `unsupported`.
    retired_pages: dict[str, int] = field(default_factory=dict)  # cause -> pages (pre-Ampere boards)
    retired_pages_pending: bool = False
    pcie_replays: int = 0
    pcie_replay_rollovers: int = 0
    nvlink_ecc_errors: int = 0  # NVLink data ECC errors over all links.
    nvlinks: int = 18
    nvlinks_down: set[int] = field(default_factory=set)
    nvlink_stopped_kib: dict[int, int] = field(default_factory=dict)  # A down link's traffic stays where it stopped.
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)  # (link, kind) -> count
    nvlink_generation: int = 4  # From 5 (Blackwell), links count physical-layer errors: kinds symbol and effective.
    # Its NVSwitch fabric, as an HGX board's: the fabric manager's registration (nvmlGpuFabricState_t; 0 where
    # the board has no fabric), the registration's NVML status, and the health flags and summary of
    # nvmlGpuFabricInfo_v3_t (0: not supported, as on a driver that has none).
    fabric_state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    fabric_status: int = pynvml.NVML_SUCCESS
    fabric_health_mask: int = 0
    fabric_health_summary: int = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    fabric_info_version: int = 3  # The newest nvmlGpuFabricInfo structure its driver knows (2: no summary yet).
    clock_events: int = 0  # Extra clock event reason bits, beyond the idle bit the load implies.
    violation_seconds: dict[int, float] = field(default_factory=dict)  # perf policy -> seconds
    processes: list[SimulatedProcess] = field(default_factory=list)
    # NVML function names (and "field:<id>") this board answers with NOT_SUPPORTED. Hopper has no
    # page retirement (row remapping replaced it) and SXM boards have no fans.
    unsupported: set[str] = field(
        default_factory=lambda: {
            "nvmlDeviceGetNumFans",
            "nvmlDeviceGetFanSpeed_v2",
            f"field:{pynvml.NVML_FI_DEV_RETIRED_SBE}",
            f"field:{pynvml.NVML_FI_DEV_RETIRED_DBE}",
            f"field:{pynvml.NVML_FI_DEV_RETIRED_PENDING}",
        }
    )
    # Injected faults: NVML function name (or "*" for every call) -> NVML error code.
    errors: dict[str, int] = field(default_factory=dict)
    # The mean utilisation share between two instants of the NVML clock, for the driver's samples; None:
    # each sample is the load's utilisation at the end of its period.
    busy: Callable[[float, float], float] | None = None
    # GPU Performance Monitoring: whether the board has it (Hopper and newer), and what it measured between two
    # instants of the NVML clock; None: `GpmActivity.of_utilization` of the load at the later one. GPM metric
    # ids the board refuses are listed in `unsupported` as "gpm:<id>".
    gpm_supported: bool = True
    activity: Callable[[float, float], GpmActivity] | None = None
    # MIG: its devices while MIG mode is on (None: off), and the mode after the next GPU reset (None: as now). A
    # board without MIG lists nvmlDeviceGetMigMode in `unsupported`.
    mig: list[SimulatedMigDevice] | None = None
    mig_pending: bool | None = None


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


def nvlink_kib_for(energy_joules: float) -> int:
    """NVLink traffic follows the load: a KiB per 4 mJ keeps each link's counter moving with power."""
    return int(energy_joules * 250)
