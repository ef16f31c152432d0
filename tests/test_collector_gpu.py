"""The GPU collector through the production NVML session, over the simulated NVML library."""

import dataclasses
import logging
import shutil
import subprocess

import pynvml
import pytest

from gpufleet.devtools.nodes import BUSY, GIB, UUID0, UUID1, two_boards
from gpufleet.exporter import node
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.board import GpuTelemetry, SimulatedGpu, TrainingLoad, steady
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml

from helpers import named, nvml_present, rendered, series


@pytest.fixture
def collector(nvml, clock):
    return GpuCollector(NvmlSession(nvml, clock=clock))


def collect(collector):
    collection = collector.collect()
    return collection, rendered(collection)


def gpu_series(name, gpu=0, **labels):
    return series(name, gpu=str(gpu), uuid=UUID0 if gpu == 0 else UUID1, **labels)


def test_every_value_matches_what_nvml_reported(collector):
    collection, samples = collect(collector)
    assert collection.problems == ()
    expected = {
        "gpufleet_gpu_utilization_ratio": 0.87,
        "gpufleet_gpu_memory_copy_utilization_ratio": 0.41,
        "gpufleet_gpu_encoder_utilization_ratio": 0.0,
        "gpufleet_gpu_decoder_utilization_ratio": 0.05,
        "gpufleet_gpu_memory_used_bytes": 40 * GIB,
        "gpufleet_gpu_memory_free_bytes": 81559 * 1024**2 - 40 * GIB,
        "gpufleet_gpu_memory_total_bytes": 81559 * 1024**2,
        "gpufleet_gpu_power_watts": 612.5,
        "gpufleet_gpu_power_limit_watts": 700.0,
        "gpufleet_gpu_energy_joules_total": 123456.789,
        "gpufleet_gpu_temperature_celsius": 64,
        "gpufleet_gpu_memory_temperature_celsius": 71,
        "gpufleet_gpu_thermal_margin_celsius": 89 - 64,
        "gpufleet_gpu_performance_state": 0,
        "gpufleet_gpu_pcie_link_generation": 5,
        "gpufleet_gpu_pcie_link_max_generation": 5,
        "gpufleet_gpu_pcie_link_width": 16,
        "gpufleet_gpu_pcie_link_max_width": 16,
    }
    for name, value in expected.items():
        assert samples[gpu_series(name)] == pytest.approx(value), name
    assert samples[gpu_series("gpufleet_gpu_clock_hertz", clock="sm")] == 1755e6
    assert samples[gpu_series("gpufleet_gpu_clock_hertz", clock="memory")] == 2619e6
    assert samples[gpu_series("gpufleet_gpu_clock_max_hertz", clock="sm")] == 1980e6
    assert named(samples, "gpufleet_gpu_temperature_threshold_celsius") and all(
        samples[gpu_series("gpufleet_gpu_temperature_threshold_celsius", threshold=t)] == v
        for t, v in (("shutdown", 92), ("slowdown", 89), ("gpu_max", 87), ("memory_max", 95))
    )
    assert samples[series("gpufleet_gpu_devices")] == 2
    assert samples[series(
        "gpufleet_gpu_info", gpu="1", uuid=UUID1, name="NVIDIA A100-PCIE-40GB", pci_bus_id="00000000:2A:00.0",
        serial="1650923000002", vbios="96.00.99.00.01", driver_version="570.133.20", cuda_version="12.8",
    )] == 1


def test_memory_the_driver_reserves_is_neither_used_nor_free_as_nvidia_smi_counts_it(nvml, collector):
    board = nvml.gpus[0]
    board.memory_reserved_bytes = 615 * 1024**2  # What an H200's driver set aside (bench/gpu_check.py).
    _, samples = collect(collector)
    assert samples[gpu_series("gpufleet_gpu_memory_reserved_bytes")] == 615 * 1024**2
    assert samples[gpu_series("gpufleet_gpu_memory_used_bytes")] == 40 * GIB
    assert samples[gpu_series("gpufleet_gpu_memory_free_bytes")] == board.memory_total_bytes - 40 * GIB - 615 * 1024**2


def test_a_driver_without_the_second_memory_call_counts_the_reserve_as_used(nvml, collector):
    board = nvml.gpus[0]
    board.memory_reserved_bytes = 615 * 1024**2
    board.unsupported.add("nvmlDeviceGetMemoryInfo_v2")
    collection, samples = collect(collector)
    assert collection.problems == ()
    assert gpu_series("gpufleet_gpu_memory_reserved_bytes") not in samples
    assert samples[gpu_series("gpufleet_gpu_memory_used_bytes")] == 40 * GIB + 615 * 1024**2
    assert samples[gpu_series("gpufleet_gpu_memory_free_bytes")] == board.memory_total_bytes - 40 * GIB - 615 * 1024**2


def test_dear_readings_are_read_at_their_tier_and_served_unchanged_between(nvml, clock):
    collector = GpuCollector(NvmlSession(nvml, clock=clock, slow_every=3, counter_every=6))
    board = nvml.gpus[0]
    _, first = collect(collector)
    board.violation_seconds[pynvml.NVML_PERF_POLICY_POWER] = 7.0
    board.pcie_replays = 5
    board.load = steady(dataclasses.replace(BUSY, power_watts=300.0, energy_joules=200000.0,
                                            temperature_celsius=80.0))
    counters = (("gpufleet_gpu_violation_seconds_total", {"policy": "power"}), ("gpufleet_gpu_pcie_replays_total", {}),
                ("gpufleet_gpu_energy_joules_total", {}))
    _, soon = collect(collector)
    assert soon[gpu_series("gpufleet_gpu_power_watts")] == 300.0  # Read every collection.
    for name, labels in (*counters, ("gpufleet_gpu_thermal_margin_celsius", {})):
        assert soon[gpu_series(name, **labels)] == first[gpu_series(name, **labels)], name
    collect(collector)
    _, slow = collect(collector)  # The fourth: the slow tier's second read.
    assert slow[gpu_series("gpufleet_gpu_thermal_margin_celsius")] == 89 - 80
    for name, labels in counters:
        assert slow[gpu_series(name, **labels)] == first[gpu_series(name, **labels)], name
    for _ in range(2):
        collect(collector)
    _, counted = collect(collector)  # The seventh: the counters' second read.
    assert counted[gpu_series("gpufleet_gpu_violation_seconds_total", policy="power")] == 7.0
    assert counted[gpu_series("gpufleet_gpu_pcie_replays_total")] == 5
    assert counted[gpu_series("gpufleet_gpu_energy_joules_total")] == 200000.0


def test_fans_are_reported_per_fan_where_the_board_has_them(collector):
    _, samples = collect(collector)
    assert named(samples, "gpufleet_gpu_fan_speed_ratio") == {
        frozenset({("gpu", "1"), ("uuid", UUID1), ("fan", "0")}): 0.3,
        frozenset({("gpu", "1"), ("uuid", UUID1), ("fan", "1")}): 0.35,
    }


def test_energy_is_a_counter():
    families = {f.name: f.type for f in GpuCollector(NvmlSession(SimulatedNvml(two_boards()))).collect().families}
    assert families["gpufleet_gpu_energy_joules"] == "counter"
    assert families["gpufleet_gpu_power_watts"] == "gauge"


def test_unsupported_sources_are_left_out_for_that_gpu_only_and_logged_once(nvml, collector, caplog):
    nvml.gpus[1].unsupported = {"nvmlDeviceGetMarginTemperature", "field:82", "nvmlDeviceGetEncoderUtilization"}
    with caplog.at_level(logging.INFO, logger="gpufleet.exporter.gpu.session"):
        collection, samples = collect(collector)
        collect(collector)
    assert collection.problems == ()
    for name in ("gpufleet_gpu_thermal_margin_celsius", "gpufleet_gpu_memory_temperature_celsius",
                 "gpufleet_gpu_encoder_utilization_ratio"):
        assert gpu_series(name, gpu=0) in samples
        assert gpu_series(name, gpu=1) not in samples, name
    lines = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert "NVML nvmlDeviceGetMarginTemperature is not supported on GPU 1; its series are left out" in lines
    assert "NVML field 82 (memory temperature) is not supported on GPU 1; its series are left out" in lines
    # GPU 0's fans and page retirement (an H100 has neither), NVLink5's two error fields (both boards' links are
    # older), and the three above: once each, not per collection, and once for all of a GPU's links.
    assert len(lines) == 9


def test_sentinel_values_never_reach_metrics(nvml, collector):
    nvml.gpus[0].load = steady(GpuTelemetry(temperature_celsius=0xFFFFFFFF, memory_temperature_celsius=0xFFFFFFFF,
                                            performance_state=32, power_watts=70.0))
    _, samples = collect(collector)
    for name in ("gpufleet_gpu_temperature_celsius", "gpufleet_gpu_memory_temperature_celsius",
                 "gpufleet_gpu_performance_state"):
        assert gpu_series(name) not in samples, name
    assert samples[gpu_series("gpufleet_gpu_power_watts")] == 70.0


def test_a_failing_call_drops_only_its_values_and_is_reported(nvml, collector):
    nvml.gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NO_PERMISSION
    collection, samples = collect(collector)
    assert gpu_series("gpufleet_gpu_power_watts") not in samples
    assert samples[gpu_series("gpufleet_gpu_temperature_celsius")] == 64
    assert samples[gpu_series("gpufleet_gpu_power_watts", gpu=1)] == 71.25
    assert collection.problems == ("GPU 0: nvmlDeviceGetPowerUsage: Insufficient Permissions",)


def test_a_lost_gpu_loses_its_values_and_the_others_keep_reporting(nvml, collector):
    collect(collector)
    nvml.gpus[1].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    collection, samples = collect(collector)
    assert collection.problems == (f"GPU 1 ({UUID1}) is lost: GPU is lost",)
    # Only the GPU's up and info series remain, and the action it needs: no stale values.
    assert sorted(name for name, labels in samples if ("gpu", "1") in labels) == [
        "gpufleet_gpu_info", "gpufleet_gpu_recovery_action", "gpufleet_gpu_recovery_action_deferred", "gpufleet_gpu_up"]
    assert samples[gpu_series("gpufleet_gpu_up", gpu=1)] == 0
    assert samples[gpu_series("gpufleet_gpu_up", gpu=0)] == 1
    assert samples[gpu_series("gpufleet_gpu_utilization_ratio")] == 0.87
    assert samples[series("gpufleet_gpu_devices")] == 2

    nvml.gpus[1].errors.clear()  # The GPU answers again (after a reset): it is reopened.
    collection, samples = collect(collector)
    assert collection.problems == ()
    assert samples[gpu_series("gpufleet_gpu_up", gpu=1)] == 1
    assert samples[gpu_series("gpufleet_gpu_power_watts", gpu=1)] == 71.25


def test_a_driver_reload_reinitialises_nvml_with_backoff(nvml, collector, clock):
    collect(collector)
    nvml.reload_driver()
    collection, samples = collect(collector)
    assert collection.problems == ("NVML stopped answering: Uninitialized",)
    # Every GPU seen before is reported down; no values are served.
    assert named(samples, "gpufleet_gpu_up") == {
        frozenset({("gpu", "0"), ("uuid", UUID0)}): 0, frozenset({("gpu", "1"), ("uuid", UUID1)}): 0}
    assert not named(samples, "gpufleet_gpu_power_watts")
    # The board's metadata keeps its labels through the outage, so the info series does not churn.
    assert {dict(l)["driver_version"] for l in named(samples, "gpufleet_gpu_info")} == {"570.133.20"}
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # The driver is still coming back.
    clock.now += 1.0
    assert collector.collect().problems == ("NVML initialisation failed: Driver Not Loaded",)
    nvml.init_error = None
    clock.now += 1.0  # Backoff has doubled to 2 s: no new attempt yet, the last reason is repeated.
    assert collector.collect().problems == ("NVML initialisation failed: Driver Not Loaded",)
    clock.now += 1.0
    collection, samples = collect(collector)
    assert collection.problems == ()
    assert samples[gpu_series("gpufleet_gpu_utilization_ratio")] == 0.87
    assert samples[gpu_series("gpufleet_gpu_up", gpu=1)] == 1


def test_a_missing_library_is_a_clear_problem(nvml, collector):
    nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    collection, samples = collect(collector)
    assert collection.problems == ("NVML initialisation failed: NVML Shared Library Not Found",)
    assert samples[series("gpufleet_gpu_driver_up")] == 0
    assert not [name for name, _ in samples if name not in ("gpufleet_gpu_xid_events_registered",
                                                            "gpufleet_gpu_driver_up")]


def test_no_gpus_is_a_failure_not_an_empty_success(clock):
    collector = GpuCollector(NvmlSession(SimulatedNvml([], clock=clock), clock=clock))
    assert collector.collect().problems == ("NVML found no GPUs",)


@pytest.mark.skipif(nvml_present(), reason="this machine has an NVIDIA driver")
def test_auto_backend_never_invents_gpus_without_a_driver():
    args = node.defaults()
    args.sysfs_root = "/nonexistent"
    [collector] = [c for c in node.build(args, node.hardware(args)) if c.name == "gpu"]
    try:
        collection, samples = collect(collector.collector)
    finally:
        collector.close()
    assert collection.problems[0].startswith("NVML initialisation failed")
    assert not [name for name in dict(samples) if name[0].startswith("gpufleet_gpu_") and
                name[0] not in ("gpufleet_gpu_xid_events_registered", "gpufleet_gpu_driver_up")]


def test_training_load_moves_power_and_utilisation_together_and_energy_never_decreases():
    gpu = SimulatedGpu(index=0, uuid=UUID0, load=TrainingLoad(seed=1, index=0))
    readings = [gpu.load(gpu, t) for t in range(0, 600, 7)]
    energies = [r.energy_joules for r in readings]
    assert energies == sorted(energies) and energies[0] >= 0
    busiest = max(readings, key=lambda r: r.utilization)
    quietest = min(readings, key=lambda r: r.utilization)
    assert busiest.power_watts > quietest.power_watts
    assert busiest.sm_clock_hertz > quietest.sm_clock_hertz
    assert all(r.power_watts <= gpu.power_limit_watts for r in readings)


@pytest.mark.gpu
@pytest.mark.skipif(not nvml_present() or shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU and driver")
def test_real_gpus_match_nvidia_smi():
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    collection, samples = collect(GpuCollector(NvmlSession(pynvml)))
    assert collection.problems == ()
    for line in smi.strip().splitlines():
        index, uuid, bus_id, memory_mib = (part.strip() for part in line.split(","))
        info = [dict(l) for l in named(samples, "gpufleet_gpu_info") if dict(l)["gpu"] == index]
        assert len(info) == 1 and info[0]["uuid"] == uuid and info[0]["pci_bus_id"].lower() == bus_id.lower()
        total = samples[series("gpufleet_gpu_memory_total_bytes", gpu=index, uuid=uuid)]
        assert total == int(memory_mib) * 1024**2


@pytest.mark.parametrize(("attribute", "name"), [("pcie_replay_rollovers", "gpufleet_gpu_pcie_replay_rollovers_total"),
                                               ("nvlink_ecc_errors", "gpufleet_gpu_nvlink_ecc_data_errors_total")])
def test_rare_error_counters_have_a_series_from_the_first_error_on(nvml, collector, attribute, name):
    _, samples = collect(collector)
    assert gpu_series(name) not in samples
    setattr(nvml.gpus[0], attribute, 3)
    _, samples = collect(collector)
    assert samples[gpu_series(name)] == 3
    assert gpu_series(name, gpu=1) not in samples


def test_nvlink5_symbol_errors_are_totalled_and_only_errors_past_the_fec_make_a_link_erring(nvml, collector):
    board = nvml.gpus[0]
    board.nvlink_generation, board.nvlinks = 5, 2
    board.nvlink_errors = {(0, "symbol"): 100, (1, "symbol"): 40, (1, "effective"): 2}
    _, samples = collect(collector)
    assert samples[gpu_series("gpufleet_gpu_nvlink_errors_total", error="symbol")] == 140
    assert samples[gpu_series("gpufleet_gpu_nvlink_errors_total", error="effective")] == 2
    erring = {dict(labels)["link"] for name, labels in samples if name == "gpufleet_gpu_nvlink_link_errors_total"}
    assert erring == {"1"}  # Link 0's symbol errors alone are the FEC at work.
