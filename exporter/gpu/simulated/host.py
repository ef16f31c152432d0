"""Host identities of simulated machines: board UUIDs, serials and PCI addresses, MIG devices, and the
cgroup paths that Slurm and the kubelet give a job's processes, which job attribution reads from procfs.

Every simulated board, in `--gpu.backend=sim` and in the fleet simulator, gets
its identity here, so the same key always names the same boards.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import psutil

from gpufleet.exporter.gpu.simulated.board import (
    Load,
    SimulatedGpu,
    SimulatedMigDevice,
    SimulatedProcess,
    TrainingLoad,
)
from gpufleet.exporter.tree import MemoryTree


def _hex(rng: random.Random, digits: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(digits))


def slurm_cgroup(job_id: int, task: int) -> str:
    """A cgroup v2 path as slurmstepd creates it for one task of a job step."""
    return f"/system.slice/slurmstepd.scope/job_{job_id}/step_0/user/task_{task}"


def kubernetes_cgroup(pod_uid: str, container_id: str) -> str:
    """A cgroup v2 path as the kubelet's systemd driver creates it for a burstable pod under containerd."""
    escaped = pod_uid.replace("-", "_")
    return (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice/"
            f"cri-containerd-{container_id}.scope")


def random_uuid(rng: random.Random) -> str:
    """A UUID's 8-4-4-4-12 hex digits, drawn from `rng`: for boards, pods and jobs alike."""
    return "-".join(_hex(rng, n) for n in (8, 4, 4, 4, 12))


def simulated_board(index: int, key: str, load: Load, **board: Any) -> SimulatedGpu:
    """Board `index` of the machine named by `key`, with the UUID, serial and PCI bus id derived from both.

    Every simulated board, in `--gpu.backend=sim` and in the fleet simulator, gets its identity here, so
    the same key always names the same boards.
    """
    rng = random.Random(f"{key}:{index}")
    return SimulatedGpu(index=index, uuid=f"GPU-{random_uuid(rng)}", load=load,
                        serial=str(1650923000000 + rng.randrange(10**6)),
                        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0", **board)


def simulated_gpus(count: int, seed: int = 0) -> list[SimulatedGpu]:
    """`count` H100s running a training load, with stable identities derived from the seed.

    The first half of the GPUs run one process each of a Slurm job, the rest one
    process each of a Kubernetes pod, so job attribution has both to show.
    """
    rng = random.Random(seed)
    slurm_job = 100000 + rng.randrange(900000)
    pod_uid = random_uuid(rng)
    container = _hex(rng, 64)
    gpus = []
    for index in range(count):
        if index < (count + 1) // 2:
            process = SimulatedProcess(20000 + index, slurm_cgroup(slurm_job, index))
        else:
            process = SimulatedProcess(30000 + index, kubernetes_cgroup(pod_uid, container))
        gpus.append(simulated_board(index, f"sim:{seed}", TrainingLoad(seed, index), processes=[process]))
    return gpus


def simulated_procfs(gpus: Sequence[SimulatedGpu]) -> MemoryTree:
    """`<pid>/cgroup` for every simulated process, as the kernel shows them under cgroup v2, and `stat` with this
    host's boot time, which the recovery actions read to see a reboot."""
    procfs = MemoryTree()
    procfs.set("stat", f"btime {int(psutil.boot_time())}\n")
    for gpu in gpus:
        for process in gpu.processes:
            procfs.set(f"{process.pid}/cgroup", f"0::{process.cgroup}")
    return procfs


def mig_devices(key: str, profiles: Sequence[str]) -> list[SimulatedMigDevice]:
    """One GPU instance with one compute instance per profile, numbered as the driver numbers a fresh layout.

    A profile `Ng.Mgb` gets M GiB, less the 2.5 % the driver keeps for itself.
    """
    rng = random.Random(f"mig:{key}")
    devices = []
    for instance, name in enumerate(profiles, start=1):
        match = re.fullmatch(r"\d+g\.(\d+)gb(\+\w+)?", name)
        if match is None:
            raise ValueError(f"MIG profile {name!r} is not of the form 1g.10gb")
        devices.append(SimulatedMigDevice(instance, 0, name, int(int(match.group(1)) * 1024**3 * 0.975),
                                          f"MIG-{random_uuid(rng)}"))
    return devices
