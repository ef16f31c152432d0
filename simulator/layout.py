"""Which nodes run which training job: drawn from a seed, or given.

A drawn layout is what a demo wants: most nodes busy in jobs of 1 to 32 nodes, some idle, a mix of
Slurm jobs and Kubernetes pods. A test wants the opposite: the jobs it reasons about written down
beside it, so that a change to how layouts are drawn cannot move a straggler into a job of two or
a saturated port onto an idle node. `gpufleet simulate --layout FILE` (and `Fleet(layout=...)`)
takes them:

    jobs:
      - {id: "944279", scheduler: slurm, nodes: [gpu-node-0001, gpu-node-0002]}
      - {id: e3666734-1319-4d33-8192-05760e733588, scheduler: kubernetes, nodes: [gpu-node-0004],
         period: 40s, comm_fraction: 0.3, memory_fraction: 0.7,
         checkpoint: {every: 30m, lasts: 60s, writers: first}}

Nodes in no job are idle. A job writes no checkpoints unless it says how (`Checkpoint`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet import duration
from gpufleet.exporter.gpu.simulated.host import kubernetes_cgroup, random_uuid, slurm_cgroup
from gpufleet.simulator.faults import listed

SCHEDULERS = ("slurm", "kubernetes")
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_FIELDS = {"id", "scheduler", "nodes", "period", "comm_fraction", "memory_fraction", "checkpoint"}
_CHECKPOINT_FIELDS = {"every", "lasts", "writers"}
WRITERS = ("all", "first")


class LayoutError(ValueError):
    """A layout that cannot be used; the message names the job and the field."""


@dataclass(frozen=True)
class Checkpoint:
    """A job's synchronous checkpoints: after each `every` seconds of training its ranks stop for `lasts` seconds
    to write one, then train on.

    `writers` says who writes. "all": every rank writes its own shard at once (`torch.distributed.checkpoint`),
    so every node of the job idles together. "first": the job's first node writes the whole state (a rank-0
    `torch.save`) while the others wait for it in a barrier, which NCCL spins on: to NVML their GPUs are busy
    and do nothing, as in a hung collective, and the writer's are idle, as a host straggler's are.
    """

    every: float
    lasts: float
    writers: str = "all"


@dataclass(frozen=True)
class Job:
    id: str  # A Slurm job id (digits), or a Kubernetes pod UID.
    scheduler: str  # "slurm" or "kubernetes"
    nodes: tuple[str, ...]
    period: float = 40.0  # Seconds of one compute and communication cycle.
    comm_fraction: float = 0.3  # Share of the cycle spent communicating.
    memory_fraction: float = 0.7  # Share of each GPU's memory the job holds.
    checkpoint: Checkpoint | None = None  # None: it writes none (or writes them without stopping).
    started: float = 0.0  # Simulated seconds: its steps count from here on every node, whenever each joined.

    def cgroup(self, node_index: int, gpu: int) -> str:
        """The cgroup of the job's process on one GPU of one node, as its scheduler would create it."""
        if self.scheduler == "slurm":
            return slurm_cgroup(int(self.id), node_index * 8 + gpu)
        container = random.Random(f"{self.id}:{node_index}").getrandbits(256)  # One pod per node: one container.
        return kubernetes_cgroup(self.id, f"{container:064x}")


def draw(names: Sequence[str], seed: int, idle_share: float = 0.15) -> list[Job]:
    """Training jobs over the fleet: most nodes in multi-node jobs, some idle, all from the seed."""
    rng = random.Random(f"jobs:{seed}")
    pool = list(names)
    rng.shuffle(pool)
    busy = pool[: len(pool) - int(len(pool) * idle_share)]
    jobs = []
    while busy:
        size = min(len(busy), rng.choice((1, 2, 4, 4, 8, 8, 16, 32)))
        members, busy = busy[:size], busy[size:]
        kubernetes = rng.random() < 0.3
        job_id = random_uuid(rng) if kubernetes else str(rng.randrange(100000, 999999))
        jobs.append(Job(job_id, "kubernetes" if kubernetes else "slurm", tuple(sorted(members)),
                        period=rng.uniform(20, 60), comm_fraction=rng.uniform(0.2, 0.35),
                        memory_fraction=rng.uniform(0.55, 0.9)))
    return jobs


def _share(raw: dict[str, Any], name: str, what: str, default: float, top: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= top:
        raise LayoutError(f"{what}: {name} must be a number above 0 and at most {top:g}, not {value!r}")
    return float(value)


def _seconds(raw: dict[str, Any], name: str, what: str, default: float | None = None) -> float:
    """A positive duration field, in seconds; required where it has no `default`."""
    if name in raw:
        given = raw[name]
    elif default is not None:
        given = default
    else:
        raise LayoutError(f"{what}: {name} is required")
    try:
        value = duration.parse(given)
    except duration.DurationError as err:
        raise LayoutError(f"{what}: {name}: {err}") from None
    if value <= 0:
        raise LayoutError(f"{what}: {name} must be longer than zero")
    return value


def _checkpoint(raw: Any, what: str) -> Checkpoint | None:
    if raw is None:
        return None
    what = f"{what}: checkpoint"
    if not isinstance(raw, dict):
        raise LayoutError(f"{what}: expected a mapping of every, lasts and writers, not {type(raw).__name__}")
    unknown = sorted(set(raw) - _CHECKPOINT_FIELDS)
    if unknown:
        raise LayoutError(f"{what}: unknown field {unknown[0]!r}")
    writers = raw.get("writers", Checkpoint.writers)
    if writers not in WRITERS:
        raise LayoutError(f"{what}: writers must be one of {', '.join(WRITERS)}, not {writers!r}")
    return Checkpoint(_seconds(raw, "every", what), _seconds(raw, "lasts", what), writers)


def _job(raw: Any, what: str, names: set[str], taken: dict[str, str]) -> Job:
    if not isinstance(raw, dict):
        raise LayoutError(f"{what}: expected a mapping of fields, not {type(raw).__name__}")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise LayoutError(f"{what}: unknown field {unknown[0]!r}")
    scheduler, job_id, nodes = raw.get("scheduler"), str(raw.get("id", "")), raw.get("nodes")
    if scheduler not in SCHEDULERS:
        raise LayoutError(f"{what}: scheduler must be one of {', '.join(SCHEDULERS)}, not {scheduler!r}")
    if scheduler == "slurm" and not job_id.isdigit():
        raise LayoutError(f"{what}: a Slurm job id is a number, not {job_id!r}")
    if scheduler == "kubernetes" and not _POD_UID.fullmatch(job_id):
        raise LayoutError(f"{what}: a Kubernetes job id is a pod UID (8-4-4-4-12 hex digits), not {job_id!r}")
    if not isinstance(nodes, list) or not nodes:
        raise LayoutError(f"{what}: nodes must be a list of node names")
    for node in nodes:
        if node not in names:
            raise LayoutError(f"{what}: node {node!r} is not in the fleet")
        if node in taken:
            raise LayoutError(f"{what}: node {node} already runs job {taken[node]}")
        taken[node] = job_id
    period = _seconds(raw, "period", what, default=Job.period)
    return Job(job_id, scheduler, tuple(sorted(nodes)), period,
               _share(raw, "comm_fraction", what, Job.comm_fraction, 0.9),
               _share(raw, "memory_fraction", what, Job.memory_fraction, 1.0),
               _checkpoint(raw.get("checkpoint"), what))


def load_layout(text: str, names: Sequence[str]) -> list[Job]:
    """The jobs of a layout file, checked in full against the fleet's node names."""
    taken: dict[str, str] = {}
    jobs = [_job(raw, f"job {index + 1}", set(names), taken)
            for index, raw in enumerate(listed(text, "jobs", LayoutError))]
    ids = [job.id for job in jobs]
    repeated = sorted({job_id for job_id in ids if ids.count(job_id) > 1})
    if repeated:
        raise LayoutError(f"job id {repeated[0]} is given twice")
    return jobs
