"""Which Slurm job, Kubernetes pod or Docker container each GPU is working for.

The exporter works this out itself. NVML lists the compute processes on each
GPU; each process's `<procfs>/<pid>/cgroup` names the job that started it,
under both cgroup v1 and v2:

* Slurm: `.../slurm/uid_1000/job_4242/step_0/task_0` (v1) or
  `/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0` (v2);
* Kubernetes: `/kubepods/burstable/pod<uid>/<container>` (cgroupfs driver), or
  `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`
  (systemd driver; the UID has underscores for dashes);
* Docker: `/docker/<id>` or `/system.slice/docker-<id>.scope`.

The result is a record per GPU (its process count and the labels of each job),
which the GPU collector turns into one `gpufleet_gpu_job_info` series per GPU
and job. No other GPU series carries a job label: rules join on `gpu`/`uuid`
with `group_left`, so series counts stay flat however jobs come and go. On a GPU in MIG mode a job's
series also names the GPU instance it runs in (`gpu_instance`). The dcgm-exporter convention
is accepted as well: a directory with one file per GPU index listing job ids
(`--job.mapping-dir`). Optionally, the kubelet's pod-resources socket adds the
pod's namespace and name and the container's, and names the pods that hold a GPU
with nothing running on it yet, and the training job each pod belongs to, from its name
(`podjobs`), as its `job_id`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.exporter.gpu.podjobs import PodJobs
from gpufleet.exporter.gpu.podresources import Holder, PodResourcesClient, PodResourcesUnavailable
from gpufleet.exporter.gpu.session import GpuIdentity, GpuSample
from gpufleet.exporter.sysfs import SysfsReader
from gpufleet.exporter.tree import Tree

log = logging.getLogger(__name__)

_SLURM = re.compile(r"slurm[^/]*(?:/uid_(\d+))?/job_(\d+)(?:/step_([^/]+))?")
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_DOCKER = re.compile(r"(?:/docker/|/docker-)([0-9a-f]{64})(?:\.scope)?(?:/|$)")
_JOB_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True)
class Job:
    """A job as its info series labels it; only the labels that apply are present."""

    scheduler: str
    labels: tuple[tuple[str, str], ...]

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


def _kubernetes_qos(path: str) -> str:
    if "besteffort" in path:
        return "besteffort"
    if "burstable" in path:
        return "burstable"
    return "guaranteed"  # Guaranteed pods sit directly under kubepods, with no QoS level in between.


def job_from_cgroup(text: str) -> Job | None:
    """The job named by a `/proc/<pid>/cgroup` file, or None for a process no scheduler started."""
    paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
    for path in paths:
        if match := _SLURM.search(path):
            labels = [("job_id", match.group(2))]
            if match.group(1):
                labels.append(("user_id", match.group(1)))
            return Job("slurm", tuple(labels))
    for path in paths:
        if "kubepods" in path and (match := _POD_UID.search(path)):
            return Job("kubernetes", (("pod_uid", match.group(1).replace("_", "-")),
                                      ("qos_class", _kubernetes_qos(path))))
    for path in paths:
        if match := _DOCKER.search(path):
            return Job("docker", (("container_id", match.group(1)[:12]),))
    return None


def mapping_dir_jobs(sysfs: SysfsReader, gpu_index: int) -> list[str]:
    """Job ids listed for one GPU in a dcgm-exporter style mapping directory (file named by GPU index)."""
    text = sysfs.text(str(gpu_index))
    if not text:
        return []
    ids = []
    for line in text.splitlines():
        job_id = line.strip()
        if not job_id:
            continue
        if _JOB_ID.match(job_id):
            ids.append(job_id)
        else:
            sysfs.problems.append(f"job mapping file {gpu_index}: unusable job id {job_id[:40]!r}")
    return ids


@dataclass(frozen=True)
class GpuJobs:
    """What attribution found for one GPU: its process count, its jobs, and each process's memory."""

    gpu: GpuIdentity
    processes: int
    jobs: tuple[dict[str, str], ...]  # The labels of each job: `scheduler`, then those that apply.
    process_memory: tuple[tuple[dict[str, str], int], ...] = ()  # (`pid` and the job's ids, bytes)


@dataclass(frozen=True)
class Attribution:
    gpus: tuple[GpuJobs, ...]
    problems: tuple[str, ...]


class JobAttribution:
    """Finds the jobs of one NVML sample's GPUs, reading cgroup files from a procfs tree."""

    def __init__(self, procfs: Tree, mapping_dir: Tree | None = None, process_memory: bool = False,
                 pod_resources: PodResourcesClient | None = None, pod_jobs: PodJobs | None = None) -> None:
        self.procfs = procfs
        self.pod_jobs = pod_jobs or PodJobs()
        self.mapping_dir = mapping_dir
        self.process_memory = process_memory
        self.pod_resources = pod_resources
        self._pod_resources_failure = ""

    def _gpu_pods(self) -> dict[str, list[Holder]]:
        """Pods per GPU UUID from the kubelet, or nothing: the enrichment is optional and never fails a collection."""
        if self.pod_resources is None:
            return {}
        try:
            pods = self.pod_resources.gpu_pods()
        except PodResourcesUnavailable as err:
            if str(err) != self._pod_resources_failure:
                log.warning("%s; pods are identified by UID only until it answers", err)
                self._pod_resources_failure = str(err)
            return {}
        if self._pod_resources_failure:
            log.info("kubelet pod-resources answers again")
            self._pod_resources_failure = ""
        return pods

    def attribute(self, gpus: Iterable[GpuSample]) -> Attribution:
        """Jobs per GPU, for the GPUs that can list their processes (the others have no count rather than zero)."""
        procfs = SysfsReader(self.procfs)
        mapping = SysfsReader(self.mapping_dir) if self.mapping_dir is not None else None
        gpu_pods = self._gpu_pods()
        found = []
        for gpu in gpus:
            if gpu.processes is None:
                continue
            jobs: dict[tuple[tuple[str, str], ...], Job] = {}
            memory = []
            for process in gpu.processes:
                cgroup = procfs.text(f"{process.pid}/cgroup")  # Gone if the process just exited.
                job = job_from_cgroup(cgroup) if cgroup is not None else None
                # On a GPU in MIG mode, the GPU instance the job runs in: jobs sharing a GPU are told apart.
                instance = () if process.gpu_instance is None else (("gpu_instance", str(process.gpu_instance)),)
                if job is not None:
                    jobs.setdefault((("scheduler", job.scheduler), *job.labels, *instance), job)
                if self.process_memory and process.used_memory_bytes is not None:
                    labels = {"pid": str(process.pid), **dict(instance)}
                    for name in ("job_id", "pod_uid", "container_id"):
                        if job is not None and (value := job.label(name)):
                            labels[name] = value
                    memory.append((labels, process.used_memory_bytes))
            if mapping is not None:
                slurm_ids = {job.label("job_id") for job in jobs.values() if job.scheduler == "slurm"}
                for job_id in mapping_dir_jobs(mapping, gpu.identity.index):
                    if job_id not in slurm_ids:  # The same job found by both sources is one job.
                        jobs.setdefault((("scheduler", "hpc"), ("job_id", job_id)), Job("hpc", (("job_id", job_id),)))
            labelled = _with_pods(jobs, gpu_pods.get(gpu.identity.uuid, []), self.pod_jobs)
            found.append(GpuJobs(gpu.identity, len(gpu.processes), tuple(labelled), tuple(memory)))
        problems = procfs.problems + (mapping.problems if mapping is not None else [])
        return Attribution(tuple(found), tuple(problems))


def _with_pods(jobs: dict[tuple[tuple[str, str], ...], Job], pods: list[Holder],
               pod_jobs: PodJobs) -> list[dict[str, str]]:
    """Each job's labels, with the kubelet's namespace, pod and container names added where the join is
    unambiguous, and the training job a named pod belongs to.

    The kubelet names pods and their containers, cgroups give the pods' UIDs; the two meet on the GPU. With one
    Kubernetes job and one pod on a GPU they are the same pod, and its container is named where only one of its
    containers holds the GPU. A pod that holds a GPU with no process on it yet is reported too, by name, so
    allocated-but-idle GPUs are visible.
    """
    result = [dict(key) for key in jobs]
    kubernetes = [labels for labels in result if labels["scheduler"] == "kubernetes"]
    named = {(namespace, pod) for namespace, pod, _ in pods}
    if len(named) == 1 and len(kubernetes) == 1:
        kubernetes[0]["namespace"], kubernetes[0]["pod"] = named.pop()
        if len(pods) == 1:
            kubernetes[0]["container"] = pods[0][2]
    elif not kubernetes:
        result += [{"scheduler": "kubernetes", "namespace": namespace, "pod": pod, "container": container}
                   for namespace, pod, container in pods]
    for labels in result:
        if "pod" in labels and (job_id := pod_jobs.job_id(labels["namespace"], labels["pod"])):
            labels["job_id"] = job_id
    return result
