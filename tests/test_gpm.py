"""GPU Performance Monitoring: what the SMs and tensor pipes did, beside NVML's "a kernel ran".

The exporter's own session and GPM reader run over the simulated library, which computes each metric
from its two samples as the driver does, in NVML's units (percent, MiB/s). The conversion from those
units is also checked against a stand-in that answers nothing but the documented raw values, and the
simulator's workload is checked to tell "busy" from "doing math" where a real job would.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pynvml
import pytest

from gpufleet.devtools.nodes import UUID0, FakeClock, two_boards
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter import node
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.gpm import DETAIL, METRICS, GpmReader, metric_set
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.host import simulated_procfs
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.tree import DiskTree
from gpufleet.simulator.workload import COMM, COMPUTE

from fleets import PEER, SLOW, START, Probe, value
from helpers import rendered, series

ALL = metric_set(detail=True)
GPM_FAMILIES = ("gpufleet_gpu_sm_active_ratio", "gpufleet_gpu_sm_occupancy_ratio", "gpufleet_gpu_tensor_active_ratio",
                "gpufleet_gpu_tensor_pipe_active_ratio", "gpufleet_gpu_dram_active_ratio",
                "gpufleet_gpu_fp_active_ratio", "gpufleet_gpu_pcie_throughput_bytes_per_second",
                "gpufleet_gpu_nvlink_throughput_bytes_per_second")


def gpm_series(samples: dict, gpu: int) -> dict:
    return {key: v for key, v in samples.items()
            if key[0] in GPM_FAMILIES and ("gpu", str(gpu)) in key[1]}


def collector_with(nvml: SimulatedNvml, clock: FakeClock, *flags: str) -> GpuCollector:
    """The GPU collector as `gpufleet exporter` builds it from these flags."""
    parser = argparse.ArgumentParser()
    node.add_arguments(parser)
    hardware = Hardware(nvml, DiskTree(FIXTURE_SYSFS), simulated_procfs(nvml.gpus))
    return GpuCollector.from_args(parser.parse_args(list(flags)), hardware)


def test_the_first_collection_only_samples_and_the_next_reports_the_interval(nvml, clock):
    """The busy H100 reads 87 % utilisation; the simulated driver's GPM derives its SMs' and tensor pipes'
    activity from that (90 % and 60 % of it), and the A100, which has no GPM, gets no series at all."""
    collector = GpuCollector(NvmlSession(nvml, clock=clock, gpm=ALL))
    first = rendered(collector.collect())
    assert gpm_series(first, 0) == {}
    clock.now += 15
    collection = collector.collect()
    second = rendered(collection)
    assert collection.problems == ()
    assert second[series("gpufleet_gpu_sm_active_ratio", gpu="0", uuid=UUID0)] == pytest.approx(0.9 * 0.87)
    assert second[series("gpufleet_gpu_tensor_active_ratio", gpu="0", uuid=UUID0)] == pytest.approx(0.6 * 0.87)
    assert second[series("gpufleet_gpu_fp_active_ratio", gpu="0", uuid=UUID0, precision="fp64")] == 0.0
    assert second[series("gpufleet_gpu_pcie_throughput_bytes_per_second", gpu="0", uuid=UUID0,
                         direction="receive")] == pytest.approx(2.5e9 * 0.6 * 0.87)
    assert len(gpm_series(second, 0)) == 15
    assert gpm_series(second, 1) == {}


def test_nvlink_throughput_is_the_links_counters_over_the_interval(clock):
    """GPM's NVLink total and the per-link byte counters describe the same traffic."""
    boards = two_boards()
    energy = [1000.0]
    load = boards[0].load
    boards[0].load = lambda gpu, seconds: dataclasses.replace(load(gpu, seconds), energy_joules=energy[0])
    boards[0].nvlinks = 4
    nvml = SimulatedNvml(boards, clock=clock)
    collector = GpuCollector(NvmlSession(nvml, clock=clock, gpm=ALL), nvlink_per_link=True)
    before = rendered(collector.collect())
    clock.now += 10
    energy[0] += 6000.0  # 600 W for 10 s.
    after = rendered(collector.collect())
    link_bytes = sum(after[series("gpufleet_gpu_nvlink_link_transmit_bytes_total", gpu="0", uuid=UUID0, link=str(n))]
                     - before[series("gpufleet_gpu_nvlink_link_transmit_bytes_total", gpu="0", uuid=UUID0,
                                     link=str(n))] for n in range(4))
    assert link_bytes > 0
    assert after[series("gpufleet_gpu_nvlink_throughput_bytes_per_second", gpu="0", uuid=UUID0,
                        direction="transmit")] == pytest.approx(link_bytes / 10)


def test_a_board_without_gpm_is_logged_once_and_never_reads_zero(nvml, clock, caplog):
    with caplog.at_level(logging.INFO, logger="gpufleet.exporter.gpu.session"):
        collector = GpuCollector(NvmlSession(nvml, clock=clock, gpm=ALL))
        for _ in range(3):
            samples = rendered(collector.collect())
            clock.now += 15
    assert gpm_series(samples, 1) == {}
    lines = [r.getMessage() for r in caplog.records if "GPM" in r.getMessage()]
    assert lines == ["NVML GPM (nvmlGpmQueryDeviceSupport) is not supported on GPU 1; its series are left out"]


def test_a_metric_the_board_refuses_is_left_out_once_and_the_rest_stay(nvml, clock, caplog):
    nvml.gpus[0].unsupported.add(f"gpm:{pynvml.NVML_GPM_METRIC_FP64_UTIL}")
    with caplog.at_level(logging.INFO, logger="gpufleet.exporter.gpu.gpm"):
        collector = GpuCollector(NvmlSession(nvml, clock=clock, gpm=ALL))
        for _ in range(4):
            samples = rendered(collector.collect())
            clock.now += 15
    gpm = gpm_series(samples, 0)
    assert len(gpm) == 14
    assert series("gpufleet_gpu_fp_active_ratio", gpu="0", uuid=UUID0, precision="fp64") not in gpm
    assert [r.getMessage() for r in caplog.records] == [
        "NVML GPM metric FP64 active is not supported on GPU 0; its series are left out"]


@pytest.mark.parametrize(("flags", "per_gpu"), [((), 5), (("--collector.gpu.gpm-detail",), 15),
                                                (("--no-collector.gpu.gpm",), 0)])
def test_the_flags_choose_the_series(nvml, clock, flags, per_gpu):
    collector = collector_with(nvml, clock, *flags)
    try:
        collector.collect()
        clock.now += 15
        assert len(gpm_series(rendered(collector.collect()), 0)) == per_gpu
    finally:
        collector.close()


def test_a_lost_gpu_frees_its_samples_and_drops_the_first_interval_when_it_returns(nvml, clock):
    collector = GpuCollector(NvmlSession(nvml, clock=clock, gpm=ALL))
    collector.collect()
    clock.now += 15
    assert len(gpm_series(rendered(collector.collect()), 0)) == 15
    held = len(nvml._gpm_samples)
    nvml.gpus[0].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    clock.now += 15
    lost = rendered(collector.collect())
    assert lost[series("gpufleet_gpu_up", gpu="0", uuid=UUID0)] == 0
    assert gpm_series(lost, 0) == {}
    assert len(nvml._gpm_samples) == held - 2
    del nvml.gpus[0].errors["*"]
    clock.now += 15
    assert gpm_series(rendered(collector.collect()), 0) == {}  # Back, with a new first sample.
    clock.now += 15
    assert len(gpm_series(rendered(collector.collect()), 0)) == 15
    assert len(nvml._gpm_samples) == held
    collector.close()
    assert nvml._gpm_samples == {}


def test_a_failing_sample_leaves_the_gpu_up_and_the_next_interval_spans_the_gap(nvml, clock):
    collector = GpuCollector(NvmlSession(nvml, clock=clock, gpm=ALL))
    collector.collect()
    nvml.gpus[0].errors["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_NO_PERMISSION
    clock.now += 15
    collection = collector.collect()
    samples = rendered(collection)
    assert samples[series("gpufleet_gpu_up", gpu="0", uuid=UUID0)] == 1
    assert gpm_series(samples, 0) == {}
    assert any("GPM" in problem for problem in collection.problems)
    del nvml.gpus[0].errors["nvmlGpmSampleGet"]
    clock.now += 15
    assert len(gpm_series(rendered(collector.collect()), 0)) == 15


class Documented:
    """Answers GPM with NVML's documented raw units only: a share in percent, a throughput in MiB/s."""

    def nvmlGpmSampleAlloc(self):
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, handle, sample):
        return sample

    def nvmlGpmMetricsGet(self, request):
        for index in range(request.numMetrics):
            metric = request.metrics[index]
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            # nvml.h: SM_UTIL "Percentage of SMs that were busy. 0.0 - 100.0"; PCIE_TX_PER_SEC "in MiB/sec".
            metric.value = 1024.0 if metric.metricId == pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC else 37.5
        return request


def test_each_gpm_metric_is_converted_from_the_unit_nvml_documents():
    reader = GpmReader(0, ALL)
    assert reader.read(Documented(), None) == []
    readings = {(r.metric.name, r.label_values): r.value for r in reader.read(Documented(), None)}
    assert readings[("gpufleet_gpu_sm_active_ratio", ())] == 0.375
    assert readings[("gpufleet_gpu_pcie_throughput_bytes_per_second", ("transmit",))] == 1024 * 1024 * 1024


def test_the_gpm_metric_ids_are_those_of_the_nvml_header():
    """Checked against nvml.h's nvmlGpmMetricId_t (NVIDIA's go-nvml copy of the header)."""
    ids = {m.description: m.metric_id for m in metric_set(detail=True)}
    assert ids == {"graphics active": 1, "SM active": 2, "SM occupancy": 3, "tensor active": 5, "DRAM active": 10,
                   "FP16 active": 13, "FP32 active": 12, "FP64 active": 11, "PCIe transmit": 20, "PCIe receive": 21,
                   "NVLink transmit": 61, "NVLink receive": 60, "HMMA tensor active": 7, "IMMA tensor active": 9,
                   "DMMA tensor active": 8, "DFMA tensor active": 6}
    assert len(METRICS) + len(DETAIL) == len(ids)


# The simulator: "busy" and "doing math" part where a real job's would -----------------------------------------

async def test_compute_does_math_and_a_collective_keeps_the_gpu_busy_without_it():
    """The job's step is 28 s of compute then 12 s of collectives, from START."""
    fleet = Probe()
    try:
        compute = {name: await fleet.sampled_mean(PEER, name, 20, START + 4)
                   for name in ("gpufleet_gpu_tensor_active_ratio", "gpufleet_gpu_utilization_ratio")}
        comm = {name: await fleet.sampled_mean(PEER, name, 8, START + 30)
                for name in ("gpufleet_gpu_tensor_active_ratio", "gpufleet_gpu_utilization_ratio")}
    finally:
        fleet.close()
    assert compute["gpufleet_gpu_tensor_active_ratio"] == pytest.approx(COMPUTE.tensor, rel=0.03)
    assert comm["gpufleet_gpu_tensor_active_ratio"] == pytest.approx(COMM.tensor, rel=0.03)
    assert comm["gpufleet_gpu_utilization_ratio"] == pytest.approx(COMM.utilization, abs=0.03)


async def test_a_stragglers_peers_wait_busy_and_do_less_math_than_it():
    """A 20 % clock straggler: its 28 s of compute take 36 s, and each peer spins for 8 s of every 48."""
    fleet = Probe({"kind": "straggler", "node": SLOW, "slowdown": 0.2, "cause": "clock"})
    try:
        step = 48.0
        peer_busy = await fleet.sampled_mean(PEER, "gpufleet_gpu_utilization_ratio", step)
        peer_math = await fleet.sampled_mean(PEER, "gpufleet_gpu_tensor_active_ratio", step)
        slow_math = await fleet.sampled_mean(SLOW, "gpufleet_gpu_tensor_active_ratio", step)
    finally:
        fleet.close()
    assert peer_busy > 0.9
    assert peer_math == pytest.approx((28 * COMPUTE.tensor + 12 * COMM.tensor) / step, rel=0.03)
    assert slow_math == pytest.approx((36 * COMPUTE.tensor + 12 * COMM.tensor) / step, rel=0.03)


async def test_an_idle_node_reads_no_activity():
    fleet = Probe()
    try:
        fleet.fleet.nodes[PEER].assign(None)
        await fleet.at(PEER, START)
        samples = await fleet.at(PEER, START + 15)
    finally:
        fleet.close()
    for name in ("gpufleet_gpu_sm_active_ratio", "gpufleet_gpu_tensor_active_ratio", "gpufleet_gpu_dram_active_ratio"):
        assert value(samples, name) == 0.0, name
    assert len([key for key in samples if key[0] == "gpufleet_gpu_sm_active_ratio"]) == 8
