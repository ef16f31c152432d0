"""A real Slurm on loopback for the tests: Debian's munged, slurmctld and slurmd (slurm-wlm 22.05), in a
directory of their own, with the simulator's node names.

Every node of the partition is defined in slurm.conf; the first `daemons` of them get a slurmd of their own
(each on its own port, `slurmd -N`), so that they run jobs; the others are nodes whose daemon has not
registered yet, which Slurm drains and resumes all the same. Clients reach this controller through
`Slurm.env` (`SLURM_CONF`), as any Slurm client on a host does through /etc/slurm.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpufleet.devtools.net import free_port
from gpufleet.devtools.processes import stop
from gpufleet.devtools.programs import binary
from gpufleet.devtools.waiting import HarnessError, wait_for


@dataclass
class Slurm:
    """A running controller: `env` for its clients, `nodes` its partition `partition`'s node names."""

    workdir: Path
    env: dict[str, str]
    nodes: list[str]
    partition: str
    controller: subprocess.Popen[str] | None = None  # slurmctld: a test may stop it (SIGSTOP) to play a hung one.

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm client command (`scontrol`, `sinfo`, `sbatch`) against this controller; its output."""
        result = subprocess.run([binary(argv[0]), *argv[1:]], capture_output=True, text=True, env=self.env,
                                timeout=30)
        if check and result.returncode != 0:
            raise HarnessError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's state, as sinfo words it (`idle`, `drained`, `draining`, ...), and its reason."""
        lines = self.run("sinfo", "-h", "-N", "-p", self.partition, "-o", "%N|%T|%E").splitlines()
        # A `*` marks a node whose slurmd has not answered lately: the state is what a drain decision reads.
        return {name: (state.rstrip("*"), reason) for name, state, reason in (line.split("|", 2) for line in lines)}

    def log(self) -> str:
        return "\n".join(path.read_text(errors="replace")[-3000:] for path in sorted(self.workdir.glob("*.log")))


def _conf(workdir: Path, nodes: list[str], partition: str, ports: dict[str, int], socket: Path) -> str:
    user = getpass.getuser()
    lines = [
        "ClusterName=gpufleet-test", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={ports['ctld']}",
        f"SlurmUser={user}", f"SlurmdUser={user}", "AuthType=auth/munge", f"AuthInfo=socket={socket}",
        "CredType=cred/munge", f"StateSaveLocation={workdir / 'state'}", f"SlurmdSpoolDir={workdir / 'spool'}/%n",
        f"SlurmctldPidFile={workdir / 'slurmctld.pid'}", f"SlurmdPidFile={workdir / 'spool'}/%n.pid",
        f"SlurmctldLogFile={workdir / 'slurmctld.log'}", f"SlurmdLogFile={workdir / 'slurmd'}-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "MpiDefault=none", "SwitchType=switch/none", "ReturnToService=2",
        "SlurmctldTimeout=30", "SlurmdTimeout=300",
    ]
    lines += [f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports[name]} CPUs=2 State=UNKNOWN"
              for name in nodes]
    lines.append(f"PartitionName={partition} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def slurm(workdir: Path, nodes: list[str], daemons: int = 2, partition: str = "gpu",
          timeout: float = 60) -> Iterator[Slurm]:
    """munged, slurmctld and `daemons` slurmd on loopback, stopped (and their state dropped) however the
    block ends; yields once the controller answers and the daemons' nodes are idle."""
    workdir.mkdir(parents=True, exist_ok=True)
    for folder in ("state", "spool", "munge"):
        (workdir / folder).mkdir(exist_ok=True)
    for name in nodes[:daemons]:
        (workdir / "spool" / name).mkdir(exist_ok=True)
    key, socket = workdir / "munge" / "munge.key", workdir / "munge" / "munge.socket"
    subprocess.run([binary("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True,
                   timeout=30)
    ports = {"ctld": free_port(), **{name: free_port() for name in nodes}}
    conf = workdir / "slurm.conf"
    conf.write_text(_conf(workdir, nodes, partition, ports, socket))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Slurm(workdir, env, nodes, partition)
    processes: list[subprocess.Popen[str]] = []

    def launch(*argv: str, name: str) -> None:
        output = (workdir / f"{name}.out").open("w")
        processes.append(subprocess.Popen([binary(argv[0]), *argv[1:]], stdout=output, stderr=subprocess.STDOUT,
                                          text=True, env=env))

    try:
        try:
            _start(cluster, launch, processes, key, socket, daemons, timeout)
        except HarnessError as err:
            raise HarnessError(f"{err}\n{cluster.log()}") from None
        yield cluster
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGCONT)  # One a test stopped must be able to end.
            stop(process, 15)


def _start(cluster: Slurm, launch: Callable[..., None], processes: list[subprocess.Popen[str]], key: Path,
           socket: Path, daemons: int, timeout: float) -> None:
    workdir, nodes = cluster.workdir, cluster.nodes
    launch("munged", "-F", "-f", f"--socket={socket}", f"--key-file={key}", f"--log-file={workdir / 'munged.log'}",
           f"--pid-file={workdir / 'munge' / 'munged.pid'}", f"--seed-file={workdir / 'munge' / 'seed'}",
           name="munged")
    wait_for(socket.exists, 10, "munged's socket", processes[0])
    launch("slurmctld", "-D", "-i", name="slurmctld")
    cluster.controller = processes[1]
    wait_for(lambda: "is UP" in cluster.run("scontrol", "ping", check=False), timeout, "slurmctld", processes[1])
    for name in nodes[:daemons]:
        launch("slurmd", "-D", "-N", name, name=f"slurmd-{name}")
    wait_for(lambda: all(cluster.states().get(name, ("",))[0] == "idle" for name in nodes[:daemons]), timeout,
             "the slurmd nodes idle")
