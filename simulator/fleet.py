"""The simulated fleet: nodes, the training jobs they run, and the faults injected into them.

Each node owns a `SimulatedNvml` with eight boards and an in-memory sysfs tree
(`node_sysfs`), and is collected by the collectors `gpufleet exporter` runs, built
by the same code (`exporter.node`) from the exporter's default flags. Everything a
node reports is a function of simulated time: the workload (`workload`) is a
repeating cycle of compute and communication phases, and each fault changes the
node's state between its start and end (`fault_effects`). A node's clock is
frozen while it is collected, so every value it reports in one scrape describes
one instant.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field, replace
from pathlib import Path

from prometheus_client import ProcessCollector
from prometheus_client.metrics_core import Metric

from gpufleet.exporter import node as exporter_node
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.simulated.board import SimulatedProcess
from gpufleet.exporter.gpu.simulated.host import mig_devices, simulated_board
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.state import MemoryStore, PersistentState
from gpufleet.exporter.tree import MemoryTree
from gpufleet.simulator import rates as fault_rates
from gpufleet.simulator.churn import Churn
from gpufleet.simulator.fault_effects import FaultEffects
from gpufleet.simulator.faults import RESTARTS, Fault
from gpufleet.simulator.faults import FaultKind as Kind
from gpufleet.simulator.kernel_log import SimulatedKernelLog
from gpufleet.simulator.layout import Job, draw
from gpufleet.simulator.mirror import Mirror
from gpufleet.simulator.node_state import NodeState
from gpufleet.simulator.node_sysfs import ETHERNET, NodeSysfs
from gpufleet.simulator.workload import Workload, spread

_FOREVER = math.inf
_DUE_SHARE = 0.9  # The share of its interval after which a node's visit runs a collector.
log = logging.getLogger(__name__)


def node_names(count: int) -> list[str]:
    return [f"gpu-node-{index:04d}" for index in range(1, count + 1)]


def collector_flags(collect_interval: float = math.inf, *flags: str) -> argparse.Namespace:
    """The exporter's defaults with `flags`, and no collector's interval longer than the fleet's collection
    (without one, the exporter's own intervals).

    A fleet collected every second stands for a faster clock (the end-to-end tests run the rules eight
    times faster than production). A GPU collector left on its five seconds would then sample a training
    step about once a step, where production's 15-second scrapes see a 40-second step three times.
    """
    args = exporter_node.defaults(*flags)
    for name, value in vars(args).items():
        if name.startswith("collector_") and name.endswith("_interval"):
            setattr(args, name, min(value, collect_interval))
    # A visit runs each due collector once, so the GPU reads everything it reads at every visit.
    args.gpu_slow_interval = args.gpu_counter_interval = args.collector_gpu_interval
    return args


def _collect_each(collectors: Sequence[ScheduledCollector]) -> None:
    for collector in collectors:
        collector.collect_now()


class Node:
    """One simulated GPU node and the exporter collectors that read it.

    The node composes its parts around one `NodeState`: the `Workload` it runs,
    the `FaultEffects` on its boards, and the `NodeSysfs` files its NICs and
    sensors show. It owns what the exporter would own: the collectors, their
    schedule and the exposition a scrape reads.
    """

    def __init__(self, fleet: Fleet, index: int, name: str, gpus: int) -> None:
        self.fleet = fleet
        self.state = NodeState(fleet, index, name)
        self.index = index
        self.name = name
        self.places: dict[str, str] = {}  # Its rack and leaf switch, from the fleet's topology: target labels.
        self.lock = threading.Lock()  # One collection at a time: the fleet's thread, or a first scrape.
        self.collected = False
        self.workload = Workload(self.state, [spread(f"{fleet.seed}:{name}:{gpu}") for gpu in range(gpus)])
        self.boards = [simulated_board(gpu, f"{fleet.seed}:{name}", self.workload.telemetry,
                                       busy=self.workload.busy_for(gpu), activity=self.workload.activity_for(gpu))
                       for gpu in range(gpus)]
        self.nvml = SimulatedNvml(self.boards, clock=lambda: self.state.t)
        self.kernel_log = SimulatedKernelLog()
        self.effects = FaultEffects(self.state, self.boards, self.workload, self.nvml, self.kernel_log)
        self.sysfs = MemoryTree()
        self.procfs = MemoryTree()
        self.procfs.set("stat", lambda: f"btime {self.state.boot_time()}\n")
        self.sysfs_files = NodeSysfs(self.state, self.workload, self.boards, self.sysfs, fleet.storage_hca)
        self.procfs.set("net/dev", self.sysfs_files.net_dev)
        self.ports = self.sysfs_files.ib_ports + tuple(ETHERNET)
        # Its kept state lives in memory, as the exporter's would on the node's disk: a restart reads it back.
        self.store = MemoryStore()
        # The simulated driver wakes the XID watcher's event wait when unloaded (see close()): it can wait long.
        self.hardware = Hardware(self.nvml, self.sysfs, self.procfs, nvml_event_wait_ms=30_000,
                                 state=PersistentState(self.store), kernel_log=self.kernel_log)
        self.flags = fleet.exporter_flags  # The exporter's flags on this node: the fleet's, until a GPU is taken out.
        self.collectors = exporter_node.build(self.flags, self.hardware)
        self._last_tick = [-_FOREVER] * len(self.collectors)
        self.exposition = Exposition(self.collectors, fleet.process_metrics, self.hardware.state)
        root = fleet.mirror_root
        self.mirrors = [Mirror(self.sysfs, root / name / "sys"), Mirror(self.procfs, root / name / "proc")] if root \
            else []
        for mirror in self.mirrors:  # Whole before the fleet's clock starts; a collection then changes little.
            mirror.sync()

    @property
    def leaf(self) -> str | None:
        """The leaf switch (or group of leaves, one per rail) its InfiniBand ports connect to."""
        return self.places.get("leaf")

    @property
    def t(self) -> float:
        """The node's frozen clock, in simulated seconds since the fleet started."""
        return self.state.t

    @t.setter
    def t(self, value: float) -> None:
        self.state.t = value

    @property
    def fired(self) -> set[str]:
        """Faults whose one-off events (XIDs, exporter restarts) have happened on the node."""
        return self.state.fired

    @property
    def job(self) -> Job | None:
        """The job the node runs now: the last it was assigned."""
        return self.workload.job

    def assign(self, job: Job | None) -> None:
        """Run `job` (or nothing) on every GPU of this node from its time on, with a process whose cgroup
        names the job."""
        self.workload.run(job)
        for board in self.boards:
            for process in board.processes:
                self.procfs.remove(str(process.pid))
            board.processes = []
        if job is None:
            return
        for board in self.boards:
            pid = 100000 + self.index * 10 + board.index
            # On a board in MIG mode the job runs in its first GPU instance; the others stay empty.
            instance = board.mig[0].gpu_instance if board.mig else None
            board.processes = [SimulatedProcess(pid, job.cgroup(self.index, board.index), gpu_instance=instance)]
            self.procfs.set(f"{pid}/cgroup", f"0::{board.processes[0].cgroup}")

    def apply_faults(self) -> None:
        """Bring every board's health state to what the faults say at the node's time (`FaultEffects`)."""
        self.effects.apply()

    def has_at(self, kind: Kind, t: float) -> bool:
        """Whether a fault of `kind` is active on the node at time `t` (see `NodeState.has_at`)."""
        return self.state.has_at(kind, t)

    def _restart_if_due(self) -> None:
        """A restart or reboot that has ended leaves a new exporter process: collectors built afresh, so what the
        exporter holds in memory only (the last utilisation sample read) starts again, and what it keeps
        (XID counts, recovery actions) is read back. A board replaced meanwhile shows its new identity."""
        ended = [f for f in self.state.fleet.faults_for(self.name) if f.kind in RESTARTS and f.end is not None
                 and f.end <= self.t and f.id not in self.fired]
        if not ended:
            return
        self.fired.update(f.id for f in ended)
        self.stop()  # Its driver reload wakes the old XID watcher, and empties the utilisation sample buffer.
        exporter_node.close(self.collectors)
        removed = self.effects.change_boards(ended)
        for board in removed:
            self.sysfs_files.unplug(board)
        if removed:  # Taken out on purpose, so declared as the operator would: the node's expected GPU count.
            self.flags = copy.copy(self.flags)
            self.flags.gpu_expected_count = len(self.boards)
        self.hardware = replace(self.hardware, state=PersistentState(self.store))
        self.collectors = exporter_node.build(self.flags, self.hardware)
        self._last_tick = [-_FOREVER] * len(self.collectors)
        self.exposition = Exposition(self.collectors, self.fleet.process_metrics, self.hardware.state)
        self.start()

    # Collection -----------------------------------------------------------------------------------

    def collect(self, now: float, wall: Callable[[], float]) -> None:
        """Collect what is due at simulated time `now` with the exporter's collectors, in the calling thread.

        The collectors run one after another: a thousand nodes cannot each start five threads per
        collection, and the node's clock is frozen for the whole pass anyway.
        """
        with self.lock:
            self.t = now
            churn = self.fleet.churn
            if churn is not None and (job := churn.job_at(self.name, now)) is not self.job:
                self.assign(job)
            self._restart_if_due()
            self.apply_faults()
            started = wall()
            # A visit a moment early still finds a collector due: the fleet's schedule visits each node once
            # per interval, and an exact test would leave a collector whose interval equals it for a second visit.
            due = [c for position, c in enumerate(self.collectors)
                   if started - self._last_tick[position] >= c.interval * _DUE_SHARE]
            for position, collector in enumerate(self.collectors):
                if collector in due:
                    self._last_tick[position] = started
            _collect_each(due)
            for mirror in self.mirrors:
                mirror.sync()
            self.collected = True

    async def scrape(self, now: float, wall: Callable[[], float]) -> bytes:
        """Collect what is due at `now` in a worker thread, and return the body a scrape would get."""
        await asyncio.to_thread(self.collect, now, wall)
        return self.exposition.body()

    def start(self) -> None:
        for collector in self.collectors:
            collector.start()

    def stop(self) -> None:
        """Ask the collectors to stop, then unload the simulated driver: that wakes the XID watcher's wait."""
        for collector in self.collectors:
            collector.stop()
        self.nvml.reload_driver()

    def close(self) -> None:
        self.stop()
        exporter_node.close(self.collectors)


class ProcessMetrics:
    """The simulator's own process_* families, read at most once a second and shared by every node.

    Every simulated node reports the one simulator process; reading /proc for each of a thousand
    scrapes, with a file descriptor per scrape connection to list, cost more than the scrape itself.
    """

    def __init__(self, max_age_seconds: float = 1.0) -> None:
        self._collector = ProcessCollector(registry=None)
        self._max_age = max_age_seconds
        self._read_at = -_FOREVER
        self._families: list[Metric] = []

    def __call__(self) -> list[Metric]:
        now = time.monotonic()
        if now - self._read_at >= self._max_age:
            self._families = list(self._collector.collect())
            self._read_at = now
        return self._families


@dataclass
class Fleet:
    """Nodes, jobs and faults; the HTTP side and the control API work on this."""

    node_count: int
    gpus_per_node: int = 8
    seed: int = 0
    idle_share: float = 0.15
    storage_hca: bool = False  # Every node also has a slower storage HCA of another model (node_sysfs.STORAGE_PORT).
    faults: list[Fault] = field(default_factory=list)
    fault_version: int = 0
    nodes: dict[str, Node] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list, init=False)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # Every node runs the collectors `gpufleet exporter` runs with no flags.
    exporter_flags: argparse.Namespace = field(default_factory=collector_flags)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _by_node: dict[str, list[Fault]] = field(default_factory=dict, init=False)
    process_metrics: ProcessMetrics = field(default_factory=ProcessMetrics, init=False)
    # The jobs to run; drawn from the seed (with `idle_share` of the nodes idle) where none are given.
    layout: InitVar[Sequence[Job] | None] = None
    # Mean simulated seconds a job lasts before another takes its nodes (see `churn`); None: jobs never end.
    job_lifetime: InitVar[float | None] = None
    churn: Churn | None = field(default=None, init=False)
    # Where each node's sysfs and procfs are written out as files (`<root>/<node>/sys`, `.../proc`) for a
    # node_exporter to read; None: nowhere.
    mirror_root: Path | None = None

    def __post_init__(self, layout: Sequence[Job] | None, job_lifetime: float | None) -> None:
        names = node_names(self.node_count)
        self.nodes = {name: Node(self, index, name, self.gpus_per_node) for index, name in enumerate(names, 1)}
        self._set(list(self.faults))
        self.jobs = list(layout) if layout is not None else draw(names, self.seed, self.idle_share)
        for job in self.jobs:
            for name in job.nodes:
                self.nodes[name].assign(job)
        if job_lifetime is not None:
            self.churn = Churn(self.jobs, job_lifetime, self.seed)

    def split(self, node: str, gpu: int, profiles: Sequence[str]) -> None:
        """Put one board in MIG mode with a GPU instance per profile; the node's job moves into the first.

        Raises ValueError naming what is wrong: an unknown node or GPU, or a profile not of the form 1g.10gb.
        """
        if node not in self.nodes:
            raise ValueError(f"no node {node!r}")
        if not 0 <= gpu < self.gpus_per_node:
            raise ValueError(f"{node} has no GPU {gpu}")
        board = self.nodes[node].boards[gpu]
        board.mig = mig_devices(f"{self.seed}:{node}:{gpu}", profiles)
        board.processes = [replace(p, gpu_instance=board.mig[0].gpu_instance) for p in board.processes]

    def jobs_at(self, t: float) -> list[Job]:
        """The jobs running at simulated time `t`."""
        return self.jobs if self.churn is None else self.churn.jobs_at(t)

    def faults_for(self, node: str) -> list[Fault]:
        return self._by_node.get(node, [])

    def place(self, topology: dict[str, dict[str, str]]) -> None:
        """Give each node its place (rack, leaf) from a site topology; raises ValueError for a node not in the
        fleet. A switch_down takes down the nodes of its leaf."""
        unknown = sorted(set(topology) - set(self.nodes))
        if unknown:
            raise ValueError(f"nodes not in the fleet: {', '.join(unknown[:5])}")
        for name, labels in topology.items():
            self.nodes[name].places = dict(labels)
        with self._lock:
            self._set(self.faults)

    def _set(self, faults: list[Fault]) -> None:
        """Replace the fault list and its index by node: a fleet drawn from fault rates holds thousands of
        faults, and every node reads its own many times per collection."""
        by_node: dict[str, list[Fault]] = {}
        for fault in faults:
            for node in [n.name for n in self.nodes.values() if n.leaf == fault.leaf] if fault.leaf else [fault.node]:
                by_node.setdefault(node, []).append(fault)
        self.faults, self._by_node = faults, by_node
        self.fault_version += 1

    def add(self, faults: Sequence[Fault]) -> None:
        with self._lock:
            self._set([*self.faults, *faults])

    def remove(self, fault_id: str | None = None) -> list[Fault]:
        """Remove one fault, or all of them; returns what was removed."""
        with self._lock:
            removed = [f for f in self.faults if fault_id is None or f.id == fault_id]
            gone = {id(f) for f in removed}
            self._set([f for f in self.faults if id(f) not in gone])
        return removed

    def draw_faults(self, rates: Sequence[fault_rates.Rate], horizon: float, seed: int) -> list[Fault]:
        """The faults `rates` give this fleet's GPUs, ports and nodes in [0, horizon) simulated seconds."""
        ports = {name: node.ports for name, node in self.nodes.items()}
        return fault_rates.draw(rates, ports, self.gpus_per_node, horizon, seed, self.ids)

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    async def collect_forever(self, clock: Callable[[], float], interval: float) -> None:
        """Collect every node once per `interval`, spread evenly over it, as each exporter would on its own.

        Scrapes are then served from each node's latest snapshot, as the exporter serves them: a scrape
        costs almost nothing, and a fleet too large for the CPU is collected less often rather than
        answering its scrapes too late. Each node is collected in the event loop's own thread, and the
        loop serves waiting scrapes between nodes. A worker thread would cost more than it saves: handing
        each node over and back was a fifth of a thousand-node fleet's CPU, and a thread collecting
        nonstop held the interpreter lock so long that scrapes timed out.
        """
        nodes = list(self.nodes.values())
        loop = asyncio.get_running_loop()
        gap = interval / len(nodes)
        next_start = loop.time()
        while True:
            for node in nodes:
                try:
                    node.collect(clock(), time.monotonic)
                except Exception:  # One node's surprise must not stop the fleet; it is logged.
                    log.exception("collecting %s failed", node.name)
                next_start += gap
                delay = next_start - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    continue
                # Behind: run on without sleeping until back on schedule, so that a burst of scrapes does not
                # push every later node's collection back for good; more than a whole interval behind, the
                # CPU cannot keep up, and the schedule starts again from now rather than racing.
                if -delay > interval:
                    next_start = loop.time()
                await asyncio.sleep(0)  # Let scrapes through between nodes.

    def close(self) -> None:
        """Stop every node before waiting for any: each wait is then for a thread that is already ending."""
        for node in self.nodes.values():
            node.stop()
        exporter_node.close([collector for node in self.nodes.values() for collector in node.collectors])
