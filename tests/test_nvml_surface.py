"""The NVML surface, held against NVML itself rather than against our simulation of it.

The simulated library and the code that reads it are written by the same hands, so a wrong
assumption about a function's name or unit could live in both and every other test would pass.
Here each name is checked against the installed nvidia-ml-py, and each conversion against the unit
NVML's header documents for the raw value (quoted beside it), with no simulated library involved.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pynvml
import pytest

from gpufleet.exporter.gpu.nvlink import nvlink_fields
from gpufleet.exporter.gpu.nvml import Nvml
from gpufleet.exporter.gpu.probes import FIELDS, PROBES
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.utilization import utilization_probe

CALLS = sorted(name for name in vars(Nvml) if name.startswith("nvml"))


def positional(function) -> range:
    """How many positional arguments a call accepts, from the required ones to all, not counting `self`."""
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
    return range(sum(1 for p in parameters if p.default is p.empty), len(parameters) + 1)


def arguments(name: str) -> int:
    """How many arguments gpufleet passes to the call (the Protocol's parameters are all required)."""
    return positional(getattr(Nvml, name)).start


@pytest.mark.parametrize("name", CALLS)
def test_every_call_exists_in_nvidia_ml_py_and_takes_the_arguments_we_pass(name):
    assert hasattr(pynvml, name), f"pynvml has no {name}"
    assert arguments(name) in positional(getattr(pynvml, name)), name


@pytest.mark.parametrize("name", CALLS)
def test_the_simulated_library_answers_every_call(name):
    assert arguments(name) in positional(getattr(SimulatedNvml, name)), name


class Documented:
    """Answers each call with a raw value in the unit nvml.h documents for it, and nothing else."""

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=87, memory=41)  # nvmlUtilization_t: "Percent of time over the past sample period"

    def nvmlDeviceGetSamples(self, handle, sampling_type, time_stamp):
        self.refused = getattr(self, "refused", 0) + 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # A board that keeps no samples.

    def nvmlDeviceGetEncoderUtilization(self, handle):
        return [12, 167_000]  # "utilization: ... encoder utilization value"; "samplingPeriodUs" in µs

    def nvmlDeviceGetMemoryInfo(self, handle, version):
        # nvmlMemory_v2_t, "in bytes": "reserved for system use (driver or firmware)", "Allocated device memory".
        assert version == pynvml.nvmlMemory_v2
        return SimpleNamespace(total=85_520_809_984, reserved=644_939_776, used=42_304_733_184,
                               free=42_571_137_024)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 612_500  # "Retrieves power usage for this GPU in milliwatts"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000  # "power limit ... in milliwatts"

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        return 1755  # "clock speed in MHz"

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        return SimpleNamespace(referenceTime=1_700_000_000_000_000,  # "CPU timestamp in microseconds"
                               violationTime=2_500_000_000)  # "violationTime in Nanoseconds"

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 64  # "temperature reading ... in degrees C"


@pytest.mark.parametrize(("probe", "metric", "expected"), [
    ("nvmlDeviceGetUtilizationRates", "gpufleet_gpu_utilization_ratio", 0.87),
    ("nvmlDeviceGetUtilizationRates", "gpufleet_gpu_memory_copy_utilization_ratio", 0.41),
    ("nvmlDeviceGetEncoderUtilization", "gpufleet_gpu_encoder_utilization_ratio", 0.12),
    ("nvmlDeviceGetMemoryInfo", "gpufleet_gpu_memory_used_bytes", 42_304_733_184),
    ("nvmlDeviceGetMemoryInfo", "gpufleet_gpu_memory_reserved_bytes", 644_939_776),
    ("nvmlDeviceGetPowerUsage", "gpufleet_gpu_power_watts", 612.5),
    ("nvmlDeviceGetEnforcedPowerLimit", "gpufleet_gpu_power_limit_watts", 700.0),
    ("nvmlDeviceGetClockInfo(SM)", "gpufleet_gpu_clock_hertz", 1_755_000_000),
    ("nvmlDeviceGetViolationStatus(thermal)", "gpufleet_gpu_violation_seconds_total", 2.5),
    ("nvmlDeviceGetTemperature", "gpufleet_gpu_temperature_celsius", 64),
])
def test_each_call_is_converted_from_the_unit_nvml_documents(probe, metric, expected):
    [read] = [p.read for p in (utilization_probe(), *PROBES) if p.name == probe]
    values = {reading.metric.name: reading.value for reading in read(Documented(), None)}
    assert values[metric] == pytest.approx(expected, rel=1e-12)


class Sampled(Documented):
    """The driver's utilisation samples in pynvml's own structures: one every 200 ms, as percentages."""

    def __init__(self, values: list[int]) -> None:
        self.samples = []
        for number, percent in enumerate(values, 1):
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = 1_700_000_000_000_000 + 200_000 * number  # "CPU Timestamp in microseconds"
            sample.sampleValue.uiVal = percent
            self.samples.append(sample)

    def nvmlDeviceGetSamples(self, handle, sampling_type, time_stamp):
        assert sampling_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        fresh = [s for s in self.samples if s.timeStamp > time_stamp]  # "samples with timestamp greater than"
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, fresh


def utilization(read, nvml) -> float:
    [value] = [r.value for r in read(nvml, None) if r.metric.name == "gpufleet_gpu_utilization_ratio"]
    return value


def test_utilization_is_the_mean_of_the_samples_since_the_last_collection():
    nvml, read = Sampled([100, 100, 0, 100]), utilization_probe().read
    assert utilization(read, nvml) == 0.75
    nvml.samples += Sampled([100] * 4 + [40, 40, 40, 40]).samples[4:]  # Four newer samples.
    assert utilization(read, nvml) == 0.4
    # None newer: the rates call's last sample period ("Percent of time over the past sample period").
    assert utilization(read, nvml) == 0.87


def test_a_board_without_samples_is_asked_once_and_reads_the_last_period():
    nvml, read = Documented(), utilization_probe().read
    assert [utilization(read, nvml) for _ in range(3)] == [0.87] * 3
    assert nvml.refused == 1


@pytest.mark.parametrize(("field_id", "raw", "expected"), [
    # "Total energy consumption for the GPU in mJ since the driver was last reloaded"
    (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 123_456_789, 123_456.789),
    # "NVLink TX Data throughput in KiB", and RX likewise
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1_000, 1_024_000),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 3, 3_072),
    (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 17, 17),  # a plain count
    (pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER, 2, 2),  # a plain count
    (pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL, 5, 5),  # a plain count
])
def test_each_field_is_converted_from_the_unit_nvml_documents(field_id, raw, expected):
    [field] = [f for f in (*FIELDS, *nvlink_fields([0])) if f.field_id == field_id]
    [reading] = field.readings(raw)
    assert reading.value == pytest.approx(expected, rel=1e-12)


def test_the_field_ids_are_those_of_the_nvml_header():
    """Field ids are numbers in a C header; a renumbering in nvidia-ml-py must not go unnoticed."""
    assert (pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION) == (82, 83)
    assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) == (138, 139)
    assert (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER) == (94, 95)
    assert pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL == 160
    assert (pynvml.NVML_FI_DEV_REMAPPED_COR, pynvml.NVML_FI_DEV_REMAPPED_UNC, pynvml.NVML_FI_DEV_REMAPPED_PENDING,
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE) == (142, 143, 144, 145)
