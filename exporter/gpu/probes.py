"""What the GPU collector reads from NVML, and how each raw value becomes a metric.

Each probe is one NVML call (or the one batched `nvmlDeviceGetFieldValues`
call) that yields readings in base units. Keeping the table in one place means
the support probe at start, the per-cycle read and the generated metric
reference all describe the same set. Values NVML uses as "not available" markers,
and values outside what the hardware can physically report, are dropped here
so that no sentinel ever reaches /metrics.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pynvml

from gpufleet.exporter.gpu.nvml import UNSUPPORTED, FieldValue, Handle, Nvml


@dataclass(frozen=True, eq=False)
class GpuMetric:
    """One metric the GPU collector exports; each is a module constant, so it is compared and hashed by identity.

    Readings are grouped by metric many thousand times a collection, and hashing four fields each time was
    a visible share of a thousand-node simulator's CPU.
    """

    name: str
    documentation: str
    counter: bool = False
    labels: tuple[str, ...] = ()


class Reading(NamedTuple):
    """One value read from a GPU; a tuple because a node makes about a thousand a collection."""

    metric: GpuMetric
    value: float
    label_values: tuple[str, ...] = ()


UTILIZATION = GpuMetric(
    "gpufleet_gpu_utilization_ratio",
    "Share of time in which a kernel ran since the last collection: GPM's graphics-engine activity where the "
    "board has GPM, else the mean of the driver's samples (of its last sample period where it keeps none).",
)
MEMORY_COPY_UTILIZATION = GpuMetric(
    "gpufleet_gpu_memory_copy_utilization_ratio",
    "Share of the last sample period in which device memory was read or written.",
)
ENCODER_UTILIZATION = GpuMetric("gpufleet_gpu_encoder_utilization_ratio", "Video encoder utilisation.")
DECODER_UTILIZATION = GpuMetric("gpufleet_gpu_decoder_utilization_ratio", "Video decoder utilisation.")
MEMORY_USED = GpuMetric("gpufleet_gpu_memory_used_bytes",
                        "Framebuffer memory allocated, without what the driver reserves (as nvidia-smi counts it).")
MEMORY_FREE = GpuMetric("gpufleet_gpu_memory_free_bytes", "Framebuffer memory free.")
MEMORY_RESERVED = GpuMetric(
    "gpufleet_gpu_memory_reserved_bytes",
    "Framebuffer memory the driver and firmware set aside for themselves: neither used nor free.")
MEMORY_TOTAL = GpuMetric("gpufleet_gpu_memory_total_bytes", "Framebuffer memory installed.")
POWER = GpuMetric("gpufleet_gpu_power_watts", "Power draw of the board.")
POWER_LIMIT = GpuMetric("gpufleet_gpu_power_limit_watts", "Power limit the driver enforces.")
POWER_LIMIT_DEFAULT = GpuMetric("gpufleet_gpu_power_limit_default_watts",
                                "Power limit the board ships with, before any nvidia-smi -pl.")
PERSISTENCE_MODE = GpuMetric("gpufleet_gpu_persistence_mode_enabled",
                             "1 when persistence mode is on: the driver keeps the GPU initialised with no client.")
ENERGY = GpuMetric("gpufleet_gpu_energy_joules_total", "Energy consumed since the driver was loaded.", counter=True)
TEMPERATURE = GpuMetric("gpufleet_gpu_temperature_celsius", "GPU core temperature.")
MEMORY_TEMPERATURE = GpuMetric("gpufleet_gpu_memory_temperature_celsius", "HBM memory temperature.")
TEMPERATURE_THRESHOLD = GpuMetric(
    "gpufleet_gpu_temperature_threshold_celsius",
    "Temperature at which the GPU slows down or shuts down, and the maximum operating temperatures.",
    labels=("threshold",),
)
THERMAL_MARGIN = GpuMetric(
    "gpufleet_gpu_thermal_margin_celsius",
    "Degrees left before the GPU starts thermal slowdown (negative once past it).",
)
CLOCK = GpuMetric("gpufleet_gpu_clock_hertz", "Current clock frequency.", labels=("clock",))
CLOCK_MAX = GpuMetric("gpufleet_gpu_clock_max_hertz", "Maximum clock frequency.", labels=("clock",))
PERFORMANCE_STATE = GpuMetric("gpufleet_gpu_performance_state",
                              "Performance state, 0 (P0, maximum) to 15 (P15, minimum).")
FAN_SPEED = GpuMetric("gpufleet_gpu_fan_speed_ratio", "Intended fan speed as a share of the maximum.", labels=("fan",))
PCIE_GENERATION = GpuMetric("gpufleet_gpu_pcie_link_generation", "Current PCIe link generation.")
PCIE_MAX_GENERATION = GpuMetric("gpufleet_gpu_pcie_link_max_generation",
                                "Maximum PCIe link generation of GPU and slot.")
PCIE_WIDTH = GpuMetric("gpufleet_gpu_pcie_link_width", "Current PCIe link width in lanes.")
PCIE_MAX_WIDTH = GpuMetric("gpufleet_gpu_pcie_link_max_width", "Maximum PCIe link width in lanes.")

ECC_ENABLED = GpuMetric("gpufleet_gpu_ecc_enabled", "1 when ECC is on now.")
ECC_PENDING_ENABLED = GpuMetric("gpufleet_gpu_ecc_pending_enabled", "1 when ECC will be on after the next reboot.")
ECC_ERRORS = GpuMetric("gpufleet_gpu_ecc_errors_total", "ECC errors: corrected (single-bit) or uncorrected "
                       "(double-bit); volatile since the driver loaded, aggregate over the board's life.",
                       counter=True, labels=("error", "scope"))
REMAPPED_ROWS = GpuMetric("gpufleet_gpu_remapped_rows", "Memory rows remapped, by the error that caused it.",
                          labels=("cause",))
ROW_REMAP_PENDING = GpuMetric("gpufleet_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.")
ROW_REMAP_FAILED = GpuMetric("gpufleet_gpu_row_remap_failed", "1 when a row remap failed: a candidate for RMA.")
DRIVER_RECOVERY_ACTION = GpuMetric("gpufleet_gpu_driver_recovery_action", "What the driver asks for (NVML's recovery "
                                   "action): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, 5 "
                                   "recover the IMEX domain, 6 bus reset, 7 system reboot.")
RETIRED_PAGES = GpuMetric("gpufleet_gpu_retired_pages", "Memory pages retired (GPUs before Ampere), by cause.",
                          labels=("cause",))
RETIRED_PAGES_PENDING = GpuMetric("gpufleet_gpu_retired_pages_pending",
                                  "1 when a page retirement waits for a reboot (GPUs before Ampere).")
PCIE_REPLAYS = GpuMetric("gpufleet_gpu_pcie_replays_total", "PCIe replays: link-level retransmissions.", counter=True)
PCIE_REPLAY_ROLLOVERS = GpuMetric(
    "gpufleet_gpu_pcie_replay_rollovers_total",
    "Times a PCIe packet was replayed until the replay number rolled over and the link retrained; present from the "
    "first one on.", counter=True)
NVLINK_ECC_ERRORS = GpuMetric(
    "gpufleet_gpu_nvlink_ecc_data_errors_total",
    "NVLink data ECC errors over all the GPU's links; present from the first one on.", counter=True)
CLOCK_EVENT_ACTIVE = GpuMetric("gpufleet_gpu_clock_event_active",
                               "1 while this reason holds the clocks below their target (a throttle reason).",
                               labels=("reason",))
VIOLATION = GpuMetric(
    "gpufleet_gpu_violation_seconds_total",
    "Time the clocks were held below the requested clocks by this performance policy.",
    counter=True,
    labels=("policy",),
)
# Per link; which of them reach /metrics, and the per-GPU totals over links, is `nvlink.NvlinkSummary`'s call.
NVLINK_UP = GpuMetric("gpufleet_gpu_nvlink_up", "1 when the NVLink is active.", labels=("link",))
NVLINK_ERRORS = GpuMetric("gpufleet_gpu_nvlink_link_errors_total",
                          "NVLink errors of one link, by kind: data-link (crc_flit, crc_data, replay, recovery) and, "
                          "on NVLink5, physical-layer symbol errors and effective errors after FEC.",
                          counter=True, labels=("link", "error"))
NVLINK_TRANSMIT = GpuMetric("gpufleet_gpu_nvlink_link_transmit_bytes_total", "NVLink data transmitted on one link.",
                            counter=True, labels=("link",))
NVLINK_RECEIVE = GpuMetric("gpufleet_gpu_nvlink_link_receive_bytes_total", "NVLink data received on one link.",
                           counter=True, labels=("link",))

# Raw values NVML and its users employ to mean "no value".
_SENTINELS = frozenset({0xFFFF, 0xFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
_PSTATE_UNKNOWN = 32
_HERTZ_PER_MHZ = 1_000_000
_MILLI = 1000
_PERCENT = 100
_NANO = 1_000_000_000
_KIB = 1024
COUNTER_MAX = float(2**64)

# Clock event (throttle) reasons, named as in nvidia-smi -q, with their bits.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", pynvml.nvmlClocksEventReasonGpuIdle),
    ("applications_clocks_setting", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
    ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
    ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
    ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
    ("sw_thermal_slowdown", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
    ("hw_thermal_slowdown", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
    ("hw_power_brake_slowdown", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ("display_clock_setting", pynvml.nvmlClocksEventReasonDisplayClockSetting),
)
# Performance policies whose violation time NVML accumulates (nvmlDeviceGetViolationStatus, in ns).
VIOLATION_POLICIES = (
    ("power", pynvml.NVML_PERF_POLICY_POWER),
    ("thermal", pynvml.NVML_PERF_POLICY_THERMAL),
    ("sync_boost", pynvml.NVML_PERF_POLICY_SYNC_BOOST),
    ("board_limit", pynvml.NVML_PERF_POLICY_BOARD_LIMIT),
    ("low_utilization", pynvml.NVML_PERF_POLICY_LOW_UTILIZATION),
    ("reliability", pynvml.NVML_PERF_POLICY_RELIABILITY),
)


def checked(metric: GpuMetric, raw: float, low: float, high: float, label_values: tuple[str, ...] = (),
            *, times: float = 1, per: float = 1) -> list[Reading]:
    """One reading of `raw * times / per`, or none when `raw` is a sentinel or outside [low, high].

    Dividing by `per` rather than multiplying by its inverse keeps 35 % at 0.35, not 0.35000000000000003.
    """
    if raw in _SENTINELS or not low <= raw <= high:
        return []
    return [Reading(metric, raw * times / per, label_values)]


Read = Callable[[Nvml, Handle], list[Reading]]
Call = Callable[[Nvml, Handle], int]


class Tier(enum.Enum):
    """How often a read is made. The H200 answers most calls in microseconds, and a few in a millisecond or more
    a GPU: read every collection, those would cost an 8-GPU node more than its whole CPU budget."""

    FAST = "fast"  # Every collection: what the pager and the straggler rules read.
    SLOW = "slow"  # --collector.gpu.slow-interval: dear gauges that change slowly, whose alerts wait minutes.
    COUNTER = "counter"  # --collector.gpu.counter-interval: dear counters read only as rates; hand-set modes.


@dataclass(frozen=True)
class Probe:
    """One NVML call. `static` ones describe the board and are read once per NVML session; the others at their
    tier's interval."""

    name: str
    read: Read
    static: bool = False
    tier: Tier = Tier.FAST


def _codec(metric: GpuMetric, call: Callable[[Nvml, Handle], Sequence[int]]) -> Read:
    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        utilization, _sampling_period_us = call(nvml, handle)
        return checked(metric, utilization, 0, 100, per=_PERCENT)

    return read


class MemoryInfo(NamedTuple):
    total: int
    used: int
    free: int
    reserved: int | None  # None where the driver has only the first structure, whose `used` counts it in.


def memory_info(nvml: Nvml, handle: Handle) -> MemoryInfo:
    """A GPU's (or MIG device's) memory from the call's second version, which tells the driver's reserve from what
    processes allocated; the first version, which adds the two up, where the driver lacks the second."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
    except pynvml.NVMLError as err:
        if err.value not in UNSUPPORTED:
            raise
        info = nvml.nvmlDeviceGetMemoryInfo(handle, 0)
        return MemoryInfo(info.total, info.used, info.free, None)
    return MemoryInfo(info.total, info.used, info.free, info.reserved)


MEMORY_LIMIT = float(2**56)


def _memory(nvml: Nvml, handle: Handle) -> list[Reading]:
    info = memory_info(nvml, handle)
    return (
        checked(MEMORY_USED, info.used, 0, MEMORY_LIMIT)
        + checked(MEMORY_FREE, info.free, 0, MEMORY_LIMIT)
        + checked(MEMORY_TOTAL, info.total, 1, MEMORY_LIMIT)
        + (checked(MEMORY_RESERVED, info.reserved, 0, MEMORY_LIMIT) if info.reserved is not None else [])
    )


def _milliwatts(metric: GpuMetric, call: Call) -> Read:
    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        return checked(metric, call(nvml, handle), 0, 10_000_000, per=_MILLI)

    return read


def _persistence_mode(nvml: Nvml, handle: Handle) -> list[Reading]:
    return checked(PERSISTENCE_MODE, nvml.nvmlDeviceGetPersistenceMode(handle), 0, 1)


def _temperature(nvml: Nvml, handle: Handle) -> list[Reading]:
    return checked(TEMPERATURE, nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU), -50, 250)


def _threshold(name: str, threshold: int) -> Read:
    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        value = nvml.nvmlDeviceGetTemperatureThreshold(handle, threshold)
        return checked(TEMPERATURE_THRESHOLD, value, 1, 250, (name,))

    return read


def _margin(nvml: Nvml, handle: Handle) -> list[Reading]:
    return checked(THERMAL_MARGIN, nvml.nvmlDeviceGetMarginTemperature(handle), -150, 250)


def _clock(metric: GpuMetric, call: Callable[[Nvml, Handle, int], int], name: str, clock_type: int) -> Read:
    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        return checked(metric, call(nvml, handle, clock_type), 0, 100_000, (name,), times=_HERTZ_PER_MHZ)

    return read


def _current_clock(nvml: Nvml, handle: Handle, clock_type: int) -> int:
    return nvml.nvmlDeviceGetClockInfo(handle, clock_type)


def _max_clock(nvml: Nvml, handle: Handle, clock_type: int) -> int:
    return nvml.nvmlDeviceGetMaxClockInfo(handle, clock_type)


def _performance_state(nvml: Nvml, handle: Handle) -> list[Reading]:
    state = nvml.nvmlDeviceGetPerformanceState(handle)
    return [] if state == _PSTATE_UNKNOWN else checked(PERFORMANCE_STATE, state, 0, 15)


def _fans(nvml: Nvml, handle: Handle) -> list[Reading]:
    readings: list[Reading] = []
    for fan in range(nvml.nvmlDeviceGetNumFans(handle)):
        # NVML allows more than 100% where a board overrides its fan curve.
        readings += checked(FAN_SPEED, nvml.nvmlDeviceGetFanSpeed_v2(handle, fan), 0, 200, (str(fan),), per=_PERCENT)
    return readings


def _link(metric: GpuMetric, call: Call) -> Read:
    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        return checked(metric, call(nvml, handle), 1, 64)

    return read


def _clock_events(nvml: Nvml, handle: Handle) -> list[Reading]:
    try:
        mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError as err:  # Drivers before R535 know only the older name.
        if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        mask = nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    return [Reading(CLOCK_EVENT_ACTIVE, 1.0 if mask & bit else 0.0, (name,)) for name, bit in CLOCK_EVENT_REASONS]


def _violation(name: str, policy: int) -> Read:
    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        status = nvml.nvmlDeviceGetViolationStatus(handle, policy)
        return checked(VIOLATION, status.violationTime, 0, COUNTER_MAX - 2, (name,), per=_NANO)

    return read


PROBES: tuple[Probe, ...] = (  # Stateless, shared by every GPU; `utilization.utilization_probe` is one per GPU.
    Probe("nvmlDeviceGetEncoderUtilization",
          _codec(ENCODER_UTILIZATION, lambda nvml, h: nvml.nvmlDeviceGetEncoderUtilization(h))),
    Probe("nvmlDeviceGetDecoderUtilization",
          _codec(DECODER_UTILIZATION, lambda nvml, h: nvml.nvmlDeviceGetDecoderUtilization(h))),
    Probe("nvmlDeviceGetMemoryInfo", _memory),
    Probe("nvmlDeviceGetPowerUsage", _milliwatts(POWER, lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h))),
    Probe("nvmlDeviceGetEnforcedPowerLimit",
          _milliwatts(POWER_LIMIT, lambda nvml, h: nvml.nvmlDeviceGetEnforcedPowerLimit(h))),
    Probe("nvmlDeviceGetPersistenceMode", _persistence_mode, tier=Tier.COUNTER),  # An operator's setting.
    Probe("nvmlDeviceGetTemperature", _temperature),
    Probe("nvmlDeviceGetMarginTemperature", _margin, tier=Tier.SLOW),
    Probe("nvmlDeviceGetClockInfo(SM)", _clock(CLOCK, _current_clock, "sm", pynvml.NVML_CLOCK_SM)),
    Probe("nvmlDeviceGetClockInfo(MEM)", _clock(CLOCK, _current_clock, "memory", pynvml.NVML_CLOCK_MEM)),
    Probe("nvmlDeviceGetPerformanceState", _performance_state),
    Probe("nvmlDeviceGetFanSpeed_v2", _fans),
    Probe("nvmlDeviceGetCurrPcieLinkGeneration",
          _link(PCIE_GENERATION, lambda nvml, h: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h))),
    Probe("nvmlDeviceGetCurrPcieLinkWidth", _link(PCIE_WIDTH, lambda nvml, h: nvml.nvmlDeviceGetCurrPcieLinkWidth(h))),
    Probe("nvmlDeviceGetCurrentClocksEventReasons", _clock_events),
    *(Probe(f"nvmlDeviceGetViolationStatus({name})", _violation(name, policy), tier=Tier.COUNTER)
      for name, policy in VIOLATION_POLICIES),
    # Board constants: read once per NVML session.
    Probe("nvmlDeviceGetMaxClockInfo(SM)", _clock(CLOCK_MAX, _max_clock, "sm", pynvml.NVML_CLOCK_SM), True),
    Probe("nvmlDeviceGetMaxClockInfo(MEM)", _clock(CLOCK_MAX, _max_clock, "memory", pynvml.NVML_CLOCK_MEM), True),
    Probe("nvmlDeviceGetPowerManagementDefaultLimit",
          _milliwatts(POWER_LIMIT_DEFAULT, lambda nvml, h: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)), True),
    Probe("nvmlDeviceGetMaxPcieLinkGeneration",
          _link(PCIE_MAX_GENERATION, lambda nvml, h: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)), True),
    Probe("nvmlDeviceGetMaxPcieLinkWidth",
          _link(PCIE_MAX_WIDTH, lambda nvml, h: nvml.nvmlDeviceGetMaxPcieLinkWidth(h)), True),
    Probe("nvmlDeviceGetTemperatureThreshold(SHUTDOWN)",
          _threshold("shutdown", pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN), True),
    Probe("nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
          _threshold("slowdown", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), True),
    Probe("nvmlDeviceGetTemperatureThreshold(GPU_MAX)",
          _threshold("gpu_max", pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX), True),
    Probe("nvmlDeviceGetTemperatureThreshold(MEM_MAX)",
          _threshold("memory_max", pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX), True),
)


@dataclass(frozen=True)
class Field:
    """A value read through the batched `nvmlDeviceGetFieldValues` call."""

    field_id: int
    description: str
    metric: GpuMetric
    low: float
    high: float
    per: float = 1
    times: float = 1
    scope: int | None = None  # The link, for per-link fields.
    label_values: tuple[str, ...] = ()
    tier: Tier = Tier.FAST  # When it is read, as a `Probe`; the fields of a tier are asked in one call.

    def readings(self, raw: float) -> list[Reading]:
        """The field's raw value in base units, or nothing where it is a sentinel or out of range."""
        return checked(self.metric, raw, self.low, self.high, self.label_values, times=self.times, per=self.per)


def _ecc(field_id: int, error: str, scope: str) -> Field:
    return Field(field_id, f"ECC {error} {scope}", ECC_ERRORS, 0, COUNTER_MAX - 2, label_values=(error, scope))


FIELDS: tuple[Field, ...] = (
    Field(pynvml.NVML_FI_DEV_MEMORY_TEMP, "memory temperature", MEMORY_TEMPERATURE, -50, 250),
    Field(pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "total energy", ENERGY, 0, float(2**62), per=_MILLI,
          tier=Tier.COUNTER),
    Field(pynvml.NVML_FI_DEV_ECC_CURRENT, "ECC mode", ECC_ENABLED, 0, 1),
    Field(pynvml.NVML_FI_DEV_ECC_PENDING, "pending ECC mode", ECC_PENDING_ENABLED, 0, 1, tier=Tier.COUNTER),
    _ecc(pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, "corrected", "volatile"),
    _ecc(pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, "uncorrected", "volatile"),
    _ecc(pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, "corrected", "aggregate"),
    _ecc(pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, "uncorrected", "aggregate"),
    Field(pynvml.NVML_FI_DEV_REMAPPED_COR, "remapped rows (correctable)", REMAPPED_ROWS, 0, 2**31,
          label_values=("correctable",)),
    Field(pynvml.NVML_FI_DEV_REMAPPED_UNC, "remapped rows (uncorrectable)", REMAPPED_ROWS, 0, 2**31,
          label_values=("uncorrectable",)),
    Field(pynvml.NVML_FI_DEV_REMAPPED_PENDING, "row remap pending", ROW_REMAP_PENDING, 0, 1),
    Field(pynvml.NVML_FI_DEV_REMAPPED_FAILURE, "row remap failure", ROW_REMAP_FAILED, 0, 1),
    Field(pynvml.NVML_FI_DEV_RETIRED_SBE, "retired pages (single-bit)", RETIRED_PAGES, 0, 2**31,
          label_values=("single_bit",)),
    Field(pynvml.NVML_FI_DEV_RETIRED_DBE, "retired pages (double-bit)", RETIRED_PAGES, 0, 2**31,
          label_values=("double_bit",)),
    Field(pynvml.NVML_FI_DEV_RETIRED_PENDING, "retired pages pending", RETIRED_PAGES_PENDING, 0, 1),
    Field(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, "recovery action", DRIVER_RECOVERY_ACTION, 0, 7),
    Field(pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, "PCIe replays", PCIE_REPLAYS, 0, COUNTER_MAX - 2,
          tier=Tier.COUNTER),
    # Zero on almost every GPU for its whole life: a series only from the first rollover on (low 1), so that
    # the node stays within its series budget. Field 95 in nvml.h and in nvidia-ml-py alike.
    Field(pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER, "PCIe replay rollovers", PCIE_REPLAY_ROLLOVERS, 1,
          COUNTER_MAX - 2, tier=Tier.COUNTER),
    # Likewise (field 160, "NVLink data ECC Error Counter total for all Links" in both).
    Field(pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL, "NVLink data ECC errors", NVLINK_ECC_ERRORS, 1,
          COUNTER_MAX - 2),
)

FIELD_MEMBERS = {  # The member of `nvmlValue_t` that holds each value type.
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(value: FieldValue) -> float | None:
    """The number in one `nvmlFieldValue_t`, or None where NVML returned no value for it."""
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    member = FIELD_MEMBERS.get(value.valueType)
    if member is None:
        return None
    number: float = getattr(value.value, member)
    return number


def read_fields(nvml: Nvml, handle: Handle, fields: tuple[Field, ...]) -> Iterator[tuple[Field, float | None]]:
    """Each field with its value (None where not available), from one NVML call."""
    if not fields:
        return
    values = nvml.nvmlDeviceGetFieldValues(
        handle, [f.field_id if f.scope is None else (f.field_id, f.scope) for f in fields]
    )
    for field, value in zip(fields, values, strict=True):
        yield field, field_value(value)
