"""MIG: per GPU instance, its profile, memory, activity and jobs, beside a physical GPU that keeps its health.

The exporter's own session runs over the simulated library, with board 0 split into three GPU instances
(3g.40gb, 2g.20gb, 1g.10gb): a Slurm job runs in the first, a Kubernetes pod in the third, the second
is empty.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from gpufleet.devtools.net import free_port
from gpufleet.devtools.nodes import GIB, UUID0, UUID1, FakeClock, two_boards
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.gpm import metric_set
from gpufleet.exporter.gpu.jobs import JobAttribution
from gpufleet.exporter.gpu.mig import profile
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.board import SimulatedProcess
from gpufleet.exporter.gpu.simulated.host import kubernetes_cgroup, mig_devices, simulated_procfs, slurm_cgroup
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.simulator.workload import COMPUTE

from fleets import PEER, START, Probe, value
from helpers import rendered, series

POD = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"


def gpu0(name: str, **labels: str):
    return series(name, gpu="0", uuid=UUID0, **labels)


@pytest.fixture
def nvml(clock):
    boards = two_boards()
    boards[0].mig = mig_devices("test", ["3g.40gb", "2g.20gb", "1g.10gb"])
    boards[0].processes = [SimulatedProcess(4101, slurm_cgroup(4242, 0), gpu_instance=1),
                           SimulatedProcess(4102, kubernetes_cgroup(POD, "c" * 64), gpu_instance=3)]
    return SimulatedNvml(boards, clock=clock)


def collector_over(nvml: SimulatedNvml, clock: FakeClock) -> GpuCollector:
    return GpuCollector(NvmlSession(nvml, clock=clock, gpm=metric_set(detail=False)),
                        jobs=JobAttribution(simulated_procfs(nvml.gpus)))


def collect_twice(collector: GpuCollector, clock: FakeClock) -> dict:
    collector.collect()
    clock.now += 15
    collection = collector.collect()
    assert collection.problems == ()
    return rendered(collection)


def test_each_instance_reports_its_profile_memory_and_activity(nvml, clock):
    samples = collect_twice(collector_over(nvml, clock), clock)
    assert samples[gpu0("gpufleet_gpu_mig_enabled")] == 1
    uuids = {device.gpu_instance: device.uuid for device in nvml.gpus[0].mig}
    for instance, name in ((1, "3g.40gb"), (2, "2g.20gb"), (3, "1g.10gb")):
        assert samples[gpu0("gpufleet_gpu_mig_info", gpu_instance=str(instance), compute_instance="0",
                            profile=name, mig_uuid=uuids[instance])] == 1
    assert samples[gpu0("gpufleet_gpu_mig_memory_total_bytes", gpu_instance="1")] == int(40 * GIB * 0.975)
    assert samples[gpu0("gpufleet_gpu_mig_memory_used_bytes", gpu_instance="1")] > 0
    assert samples[gpu0("gpufleet_gpu_mig_memory_used_bytes", gpu_instance="2")] == 0
    # The busy board reads 87 %: the simulated driver's tensor activity is 60 % of that where a job runs.
    assert samples[gpu0("gpufleet_gpu_mig_tensor_active_ratio", gpu_instance="1")] == pytest.approx(0.6 * 0.87)
    assert samples[gpu0("gpufleet_gpu_mig_tensor_active_ratio", gpu_instance="2")] == 0
    assert samples[gpu0("gpufleet_gpu_mig_sm_active_ratio", gpu_instance="3")] == pytest.approx(0.9 * 0.87)
    # The physical GPU keeps its health; its whole-GPU activity is left to the instances.
    assert samples[gpu0("gpufleet_gpu_up")] == 1
    assert gpu0("gpufleet_gpu_temperature_celsius") in samples
    assert gpu0("gpufleet_gpu_tensor_active_ratio") not in samples
    # The A100 has MIG, and it is off.
    assert samples[series("gpufleet_gpu_mig_enabled", gpu="1", uuid=UUID1)] == 0
    assert not [key for key in samples if key[0] == "gpufleet_gpu_mig_pending_enabled"]


def test_jobs_name_their_instance_and_keep_the_physical_gpu(nvml, clock):
    samples = collect_twice(collector_over(nvml, clock), clock)
    jobs = [dict(labels) for name, labels in samples if name == "gpufleet_gpu_job_info"]
    assert {(job["gpu"], job["gpu_instance"], job.get("job_id") or job.get("pod_uid")) for job in jobs} == {
        ("0", "1", "4242"), ("0", "3", POD)}


def test_an_instance_that_is_destroyed_frees_its_samples_and_a_new_one_starts_over(nvml, clock):
    collector = collector_over(nvml, clock)
    collect_twice(collector, clock)
    held = len(nvml._gpm_samples)
    nvml.gpus[0].mig = [device for device in nvml.gpus[0].mig if device.gpu_instance != 2]
    clock.now += 15
    samples = rendered(collector.collect())
    assert len(nvml._gpm_samples) == held - 2
    assert not [key for key in samples if ("gpu_instance", "2") in key[1]]
    nvml.gpus[0].mig = mig_devices("test", ["3g.40gb", "2g.20gb", "1g.10gb"])
    clock.now += 15
    samples = rendered(collector.collect())
    assert gpu0("gpufleet_gpu_mig_info", gpu_instance="2", compute_instance="0", profile="2g.20gb",
                mig_uuid=nvml.gpus[0].mig[1].uuid) in samples
    assert gpu0("gpufleet_gpu_mig_sm_active_ratio", gpu_instance="2") not in samples  # Its first sample only.
    collector.close()
    assert nvml._gpm_samples == {}


def test_a_mode_change_waiting_for_a_reset_shows_until_it_happens(nvml, clock):
    nvml.gpus[1].mig_pending = True
    samples = rendered(collector_over(nvml, clock).collect())
    assert samples[series("gpufleet_gpu_mig_pending_enabled", gpu="1", uuid=UUID1)] == 1
    assert gpu0("gpufleet_gpu_mig_pending_enabled") not in samples


def test_a_board_without_mig_is_logged_once_and_has_no_mig_series(nvml, clock, caplog):
    nvml.gpus[1].unsupported.add("nvmlDeviceGetMigMode")
    with caplog.at_level(logging.INFO, logger="gpufleet.exporter.gpu.session"):
        samples = collect_twice(collector_over(nvml, clock), clock)
    assert series("gpufleet_gpu_mig_enabled", gpu="1", uuid=UUID1) not in samples
    assert [r.getMessage() for r in caplog.records if "MIG" in r.getMessage()] == [
        "NVML MIG (nvmlDeviceGetMigMode) is not supported on GPU 1; its series are left out"]


@pytest.mark.parametrize(("name", "expected"), [("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
                                                ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "1c.3g.20gb"),
                                                ("NVIDIA H100 80GB HBM3", "")])
def test_the_profile_is_read_from_the_mig_devices_name(name, expected):
    assert profile(name) == expected


# The simulator: `gpufleet simulate --mig` -------------------------------------------------------------------

async def test_a_simulated_node_runs_its_job_in_the_first_instance_and_leaves_the_rest_idle():
    fleet = Probe()
    try:
        fleet.fleet.split(PEER, 0, ["4g.40gb", "3g.40gb"])
        await fleet.at(PEER, START + 4)
        samples = await fleet.at(PEER, START + 24)  # Inside the step's 28 s of compute.
    finally:
        fleet.close()
    on_gpu0 = {key: v for key, v in samples.items() if ("gpu", "0") in key[1]}
    info = sorted(dict(labels)["profile"] for name, labels in on_gpu0 if name == "gpufleet_gpu_mig_info")
    assert info == ["3g.40gb", "4g.40gb"]
    [job] = [dict(labels) for name, labels in on_gpu0 if name == "gpufleet_gpu_job_info"]
    assert job["gpu_instance"] == "1"
    tensor = {dict(labels)["gpu_instance"]: v for (name, labels), v in on_gpu0.items()
              if name == "gpufleet_gpu_mig_tensor_active_ratio"}
    assert tensor["1"] == pytest.approx(COMPUTE.tensor, rel=0.03)
    assert tensor["2"] == 0
    assert value(samples, "gpufleet_gpu_mig_enabled") == 1  # One board of eight.


@pytest.mark.parametrize(("flag", "code", "message"), [
    ("--mig=gpu-node-0001", 2, "invalid MIG layout 'gpu-node-0001'"),
    ("--mig=gpu-node-0009:0=1g.10gb", 1, "--mig gpu-node-0009:0: no node 'gpu-node-0009'"),
    ("--mig=gpu-node-0001:8=1g.10gb", 1, "gpu-node-0001 has no GPU 8"),
    ("--mig=gpu-node-0001:0=big", 1, "MIG profile 'big' is not of the form 1g.10gb"),
])
def test_a_bad_mig_layout_is_one_clear_error(flag, code, message):
    process = subprocess.run([sys.executable, "-m", "gpufleet", "simulate", "--nodes=1",
                              f"--web.listen-address=127.0.0.1:{free_port()}", flag],
                             capture_output=True, text=True, timeout=60)
    assert process.returncode == code, process.stderr
    assert message in process.stderr
    assert "Traceback" not in process.stderr
