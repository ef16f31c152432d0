"""Job attribution: NVML's processes per GPU, their cgroup files in a fixture /proc, the info series on /metrics."""

from pathlib import Path

import pynvml
import pytest

from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.jobs import JobAttribution, job_from_cgroup
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.board import GpuTelemetry, SimulatedGpu, SimulatedProcess, steady
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.tree import DiskTree

from helpers import named, rendered

FIXTURE_PROC = Path(__file__).parent / "fixtures" / "proc"
GIB = 1024**3


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd"


def board(index: int, *pids: int) -> SimulatedGpu:
    # The cgroup text is what the simulated procfs would hold; these tests read the fixture /proc instead.
    return SimulatedGpu(index=index, uuid=uuid(index), load=steady(GpuTelemetry(memory_used_bytes=4 * GIB + 2**29)),
                        processes=[SimulatedProcess(pid, cgroup="") for pid in pids])


def collect(boards, procfs=FIXTURE_PROC, mapping_dir=None, process_memory=False):
    mapping = DiskTree(mapping_dir) if mapping_dir else None
    collector = GpuCollector(NvmlSession(SimulatedNvml(boards)),
                             jobs=JobAttribution(DiskTree(procfs), mapping, process_memory))
    collection = collector.collect()
    return collection, rendered(collection)


def jobs_of(samples, index: int) -> list[dict[str, str]]:
    return sorted(
        ({k: v for k, v in labels if k not in ("gpu", "uuid")}
         for labels in named(samples, "gpufleet_gpu_job_info") if ("gpu", str(index)) in labels),
        key=lambda d: sorted(d.items()),
    )


def test_every_scheduler_layout_is_recognised():
    boards = [board(0, 1001, 1010), board(1, 1002), board(2, 1003), board(3, 1004), board(4, 1005), board(5, 1006),
              board(6, 1007), board(7, 1008)]
    collection, samples = collect(boards)
    assert collection.problems == ()
    assert jobs_of(samples, 0) == [{"scheduler": "slurm", "job_id": "4242", "user_id": "1000"}]  # Two tasks, one job.
    assert jobs_of(samples, 1) == [{"scheduler": "slurm", "job_id": "777001"}]
    assert jobs_of(samples, 2) == [{"scheduler": "kubernetes", "pod_uid": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                                    "qos_class": "burstable"}]
    assert jobs_of(samples, 3) == [{"scheduler": "kubernetes", "pod_uid": "7c6d5e4f-3a2b-1c0d-9e8f-7a6b5c4d3e2f",
                                    "qos_class": "guaranteed"}]
    assert jobs_of(samples, 4) == [{"scheduler": "kubernetes", "pod_uid": "11112222-3333-4444-5555-666677778888",
                                    "qos_class": "besteffort"}]
    assert jobs_of(samples, 5) == [{"scheduler": "docker", "container_id": "1234567890ab"}]
    assert jobs_of(samples, 6) == []  # A login session: no scheduler, no job.
    assert jobs_of(samples, 7) == []
    processes = {dict(l)["gpu"]: v for l, v in named(samples, "gpufleet_gpu_processes").items()}
    assert processes == {"0": 2, "1": 1, "2": 1, "3": 1, "4": 1, "5": 1, "6": 1, "7": 1}


def test_a_gpu_shared_by_two_jobs_has_two_info_series_and_no_other_series_gains_job_labels():
    _, samples = collect([board(0, 1002, 1011)])
    assert jobs_of(samples, 0) == [{"scheduler": "slurm", "job_id": "777001"},
                                   {"scheduler": "slurm", "job_id": "777002"}]
    for (name, labels) in samples:
        if name not in ("gpufleet_gpu_job_info",):
            assert not {"job_id", "pod_uid", "scheduler"} & {k for k, _ in labels}, name


def test_exited_garbled_and_unknown_processes_do_not_break_the_collection():
    collection, samples = collect([board(0, 1099, 1009, 1008, 1001), board(1, 1100)])
    assert jobs_of(samples, 0) == [{"scheduler": "slurm", "job_id": "4242", "user_id": "1000"}]
    assert jobs_of(samples, 1) == []
    assert samples[("gpufleet_gpu_processes", frozenset({("gpu", "0"), ("uuid", uuid(0))}))] == 4
    # An exited process is normal; a cgroup file that cannot be read is reported.
    assert collection.problems == ("1100/cgroup: cannot read: Is a directory",)
    assert samples[("gpufleet_gpu_power_watts", frozenset({("gpu", "0"), ("uuid", uuid(0))}))] == 70.0


def test_idle_gpus_report_zero_processes_and_no_job():
    _, samples = collect([board(0)])
    assert samples[("gpufleet_gpu_processes", frozenset({("gpu", "0"), ("uuid", uuid(0))}))] == 0
    assert not named(samples, "gpufleet_gpu_job_info")


def test_a_gpu_that_cannot_list_processes_reports_no_count_rather_than_zero():
    quiet = board(0, 1001)
    quiet.unsupported.add("nvmlDeviceGetComputeRunningProcesses")
    collection, samples = collect([quiet])
    assert collection.problems == ()
    assert not named(samples, "gpufleet_gpu_processes")
    assert not named(samples, "gpufleet_gpu_job_info")


def test_per_process_memory_is_off_by_default_and_carries_the_job_when_on():
    _, samples = collect([board(0, 1001, 1010), board(1, 1007)])
    assert not named(samples, "gpufleet_gpu_process_memory_used_bytes")
    _, samples = collect([board(0, 1001, 1010), board(1, 1007)], process_memory=True)
    memory = {tuple(sorted(l)): v for l, v in named(samples, "gpufleet_gpu_process_memory_used_bytes").items()}
    assert memory == {
        (("gpu", "0"), ("job_id", "4242"), ("pid", "1001"), ("uuid", uuid(0))): 2 * GIB,  # (4.5 GiB - 0.5) / 2
        (("gpu", "0"), ("job_id", "4242"), ("pid", "1010"), ("uuid", uuid(0))): 2 * GIB,
        (("gpu", "1"), ("pid", "1007"), ("uuid", uuid(1))): 4 * GIB,
    }


def test_the_dcgm_exporter_mapping_directory(tmp_path):
    (tmp_path / "0").write_text("4242\n")  # Also found in the cgroup: one job, not two.
    (tmp_path / "1").write_text("job-a\njob-b\n\n")
    (tmp_path / "2").write_text("bad id with spaces\n")
    collection, samples = collect([board(0, 1001), board(1), board(2), board(3)], mapping_dir=tmp_path)
    assert jobs_of(samples, 0) == [{"scheduler": "slurm", "job_id": "4242", "user_id": "1000"}]
    assert jobs_of(samples, 1) == [{"scheduler": "hpc", "job_id": "job-a"}, {"scheduler": "hpc", "job_id": "job-b"}]
    assert jobs_of(samples, 2) == [] and jobs_of(samples, 3) == []
    assert collection.problems == ("job mapping file 2: unusable job id 'bad id with spaces'",)


def test_a_lost_gpu_reports_no_jobs():
    lost = board(1, 1002)
    lost.errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    _, samples = collect([board(0, 1001), lost])
    assert jobs_of(samples, 1) == [] and jobs_of(samples, 0) != []


@pytest.mark.parametrize(("text", "expected"), [
    ("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     "kubelet-kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-"
     + "a" * 64 + ".scope", ("kubernetes", "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")),  # kubelet nested in a slice
    ("0::/system.slice/docker-" + "b" * 64 + ".scope", ("docker", "bbbbbbbbbbbb")),
    ("0::/system.slice/slurmstepd.scope/job_12/step_extern/user/task_special", ("slurm", "12")),
    ("0::/machine.slice/libpod-" + "c" * 64 + ".scope", None),  # Podman: not a scheduler we attribute.
    ("", None),
])
def test_more_cgroup_layouts(text, expected):
    job = job_from_cgroup(text)
    if expected is None:
        assert job is None
    else:
        assert job is not None and job.scheduler == expected[0]
        assert expected[1] in dict(job.labels).values()
