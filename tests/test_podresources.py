"""Kubernetes enrichment through a real gRPC server speaking the kubelet's pod-resources API on a Unix socket."""

import logging
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.jobs import JobAttribution
from gpufleet.exporter.gpu.podjobs import PodJobs, compile_pattern
from gpufleet.exporter.gpu.podresources import (
    PodResourcesClient,
    PodResourcesUnavailable,
    gpu_pods,
)
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.board import GpuTelemetry, SimulatedGpu, SimulatedProcess, steady
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.tree import DiskTree

from helpers import named, rendered

FIXTURE_PROC = Path(__file__).parent / "fixtures" / "proc"
POD_UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"  # What fixture pid 1003's cgroup names.


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def container(name: str, resource: str, *device_ids: str) -> bytes:
    devices = field(1, resource.encode()) + b"".join(field(2, d.encode()) for d in device_ids)
    devices += field(3, field(1, varint(8) + varint(0)))  # Topology: a nested message to skip.
    cpu_ids = field(3, varint(4) + varint(5))  # Packed repeated int64: skipped.
    return field(1, name.encode()) + field(2, devices) + cpu_ids + varint(6 << 3 | 0) + varint(300)  # And a varint.


def pod(namespace: str, name: str, *containers: bytes) -> bytes:
    return field(1, name.encode()) + field(2, namespace.encode()) + b"".join(field(3, c) for c in containers)


def response(*pods: bytes) -> bytes:
    return b"".join(field(1, p) for p in pods)


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd"


@pytest.fixture
def kubelet(tmp_path):
    """A gRPC server on a Unix socket whose List answer the test sets."""
    answer = {"bytes": b""}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(lambda request, context: answer["bytes"])}
    ),))
    socket = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    yield socket, answer
    server.stop(grace=None)


def collect(socket_path, boards):
    client = PodResourcesClient(str(socket_path))
    collector = GpuCollector(NvmlSession(SimulatedNvml(boards)),
                             jobs=JobAttribution(DiskTree(FIXTURE_PROC), pod_resources=client))
    try:
        collection = collector.collect()
    finally:
        collector.close()
    return collection, rendered(collection)


def board(index, *pids):
    return SimulatedGpu(index=index, uuid=uuid(index), load=steady(GpuTelemetry()),
                        processes=[SimulatedProcess(pid, "") for pid in pids])


def infos(samples, index):
    return [{k: v for k, v in labels if k not in ("gpu", "uuid")}
            for labels in named(samples, "gpufleet_gpu_job_info") if ("gpu", str(index)) in labels]


def test_pods_are_named_and_allocated_idle_gpus_are_shown(kubelet):
    socket, answer = kubelet
    answer["bytes"] = response(
        pod("ml-team", "trainer-0", container("worker", "nvidia.com/gpu", uuid(0)),
            container("sidecar", "rdma/hca_shared_devices_a", "rdma0")),
        pod("ml-team", "trainer-1", container("worker", "nvidia.com/gpu", uuid(1))),
    )
    collection, samples = collect(socket, [board(0, 1003), board(1)])
    assert collection.problems == ()
    assert infos(samples, 0) == [{"scheduler": "kubernetes", "pod_uid": POD_UID, "qos_class": "burstable",
                                  "namespace": "ml-team", "pod": "trainer-0", "container": "worker"}]
    # Nothing runs on GPU 1 yet, but a pod holds it: allocated, and visible as such.
    assert infos(samples, 1) == [{"scheduler": "kubernetes", "namespace": "ml-team", "pod": "trainer-1",
                                  "container": "worker"}]


@pytest.mark.parametrize(("name", "job_id"), [
    ("llama-workers-0-3-x7k2p", "ml-team/llama-workers"),  # JobSet: replicated job "workers", job 0, pod 3.
    ("bert-12-q9z4w", "ml-team/bert"),  # An Indexed Job's pod 12.
    ("resnet-worker-7", "ml-team/resnet"),  # Kubeflow's PyTorchJob (or MPIJob) worker.
    ("resnet-master-0", "ml-team/resnet"),
    ("backup-29123456-x7k2p", None),  # A CronJob's run: its eight digits are a time stamp, not an index.
    ("web-7c9f8d5b6d-x7k2p", None),  # A Deployment's replica.
    ("trainer-model", None),  # Ends in a five-letter word with vowels: no generated suffix.
    ("notebook-0", None),  # A StatefulSet's pod: no training operator's naming.
])
def test_a_training_operators_pod_names_its_job(kubelet, name, job_id):
    socket, answer = kubelet
    answer["bytes"] = response(pod("ml-team", name, container("main", "nvidia.com/gpu", uuid(0))),
                               pod("ml-team", name, container("main", "nvidia.com/gpu", uuid(1))))
    _, samples = collect(socket, [board(0, 1003), board(1)])
    for gpu in (0, 1):  # A running job's pod, and one that holds its GPU before its process starts.
        assert [info.get("job_id") for info in infos(samples, gpu)] == [job_id], gpu


def test_a_sites_pattern_names_jobs_before_the_operators(kubelet):
    socket, answer = kubelet
    answer["bytes"] = response(pod("ml-team", "run42-rank-3", container("main", "nvidia.com/gpu", uuid(0))),
                               pod("ml-team", "bert-12-q9z4w", container("main", "nvidia.com/gpu", uuid(1))))
    client = PodResourcesClient(str(socket))
    collector = GpuCollector(NvmlSession(SimulatedNvml([board(0, 1003), board(1)])),
                             jobs=JobAttribution(DiskTree(FIXTURE_PROC), pod_resources=client,
                                                 pod_jobs=PodJobs(compile_pattern(r"(?P<job>run\d+)-rank-\d+"))))
    try:
        samples = rendered(collector.collect())
    finally:
        collector.close()
    assert [info.get("job_id") for info in infos(samples, 0)] == ["ml-team/run42"]
    assert [info.get("job_id") for info in infos(samples, 1)] == ["ml-team/bert"]


def test_a_gpu_shared_by_two_containers_of_one_pod_names_the_pod_and_no_container(kubelet):
    socket, answer = kubelet
    answer["bytes"] = response(pod("a", "one", container("left", "nvidia.com/gpu", uuid(0) + "::0"),
                                   container("right", "nvidia.com/gpu", uuid(0) + "::1")))
    _, samples = collect(socket, [board(0, 1003)])
    assert infos(samples, 0) == [{"scheduler": "kubernetes", "pod_uid": POD_UID, "qos_class": "burstable",
                                  "namespace": "a", "pod": "one"}]


def test_a_time_sliced_gpu_held_by_two_pods_is_not_guessed(kubelet):
    socket, answer = kubelet
    answer["bytes"] = response(pod("a", "one", container("c", "nvidia.com/gpu", uuid(0) + "::0")),
                               pod("b", "two", container("c", "nvidia.com/gpu", uuid(0) + "::1")))
    _, samples = collect(socket, [board(0, 1003)])
    assert infos(samples, 0) == [{"scheduler": "kubernetes", "pod_uid": POD_UID, "qos_class": "burstable"}]


def test_without_the_socket_attribution_still_works_and_says_why_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="gpufleet.exporter.gpu.jobs"):
        collection, samples = collect(tmp_path / "absent.sock", [board(0, 1003), board(1, 1001)])
    assert collection.problems == ()
    assert infos(samples, 0) == [{"scheduler": "kubernetes", "pod_uid": POD_UID, "qos_class": "burstable"}]
    assert infos(samples, 1)[0]["job_id"] == "4242"
    assert "kubelet pod-resources: UNAVAILABLE; pods are identified by UID only" in caplog.text


def test_a_malformed_answer_is_an_error_not_a_crash(kubelet):
    socket, answer = kubelet
    answer["bytes"] = b"\x0a\xff\xff\xff\x0f"  # A length far beyond the message.
    client = PodResourcesClient(str(socket))
    try:
        with pytest.raises(PodResourcesUnavailable, match="malformed answer: truncated field"):
            client.gpu_pods()
    finally:
        client.close()


def test_the_decoder_reads_only_gpu_resources():
    raw = response(pod("ns", "p", container("c", "nvidia.com/gpu", "GPU-x", "GPU-y"),
                       container("d", "example.com/fpga", "GPU-z")))
    assert gpu_pods(raw) == {"GPU-x": [("ns", "p", "c")], "GPU-y": [("ns", "p", "c")]}
    assert gpu_pods(b"") == {}
