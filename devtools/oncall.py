"""An on-call week of a GPU fleet at production timing: its real faults and its planned work, through the real
programs, and what reached the pager. `bench/oncall_week.py` runs it at length; CI runs `short()`.

Real programs: the fleet simulator; Slurm (munge, slurmctld, and a slurmd for each node that planned work drains
there); `gpufleet remediate` in dry run, serving Slurm's view to the rules; Prometheus with the rules generated at
the week's time scale, its own alert timers (the `for` grace period after a restart, the resend delay) divided
alike; Alertmanager with the production routing, its timers divided too, delivering to a receiver here. Planned
work is done as docs/alerts/maintenance.md says, with `scontrol` and `gpufleet maintenance`; faults are the
simulator's.

The timeline (`Plan`) is in production minutes from the start. Quiet time is compressed: the faults a week of
the fleet draws from a published profile happen within the timeline rather than across seven days, and planned
work follows planned work. What alerts and routes measure in hours runs in full at the time scale, as far as
`Times` gives it room: the pager's `repeat_interval` under the RMA and the longest faults, and a maintenance's
stated end with `maintenance_overdue` after it.

This module holds the week and its plan; `oncall_run` runs it in the programs, and `oncall_judge` judges what
reached people.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet import simulator as simulator_package
from gpufleet.devtools import incidents
from gpufleet.devtools.detection import layout
from gpufleet.devtools.incidents import Injected
from gpufleet.simulator.rates import draw, load_rates

if TYPE_CHECKING:
    from gpufleet.devtools.oncall_run import Running

PROFILE = Path(simulator_package.__file__).parent / "fault-rates" / "llama3.yml"
PORTS = tuple(f"mlx5_{n}/1" for n in range(8))
# What each kind the profile draws should bring: a page, a ticket, or nothing (an application's own XID).
DRAWN = {"gpu_lost": "page", "ecc_dbe": "page", "xid 13": "none", "ib_link_down": "page", "exporter_down": "page",
         "xid 95": "page", "driver_hang": "page", "thermal_slowdown": "ticket"}
PROMETHEUS_TIMERS = {"--rules.alert.for-grace-period": "10m", "--rules.alert.resend-delay": "1m"}


@dataclass
class Fault:
    """A real fault: the simulator's body, what should reach people (`expect`: page; ticket; none, for an
    application's own error; no page, for a kind that tickets or only informs), for one on a node in
    maintenance, when the node returns and may page, and whether its node was idle as the rules judge stakes
    (a repair there waits `drain_grace` for a drain before it pages)."""

    injected: Injected
    at: float  # Production minutes from the start.
    minutes: float
    cause: str
    expect: str
    returns: float | None = None  # Production minutes: the node's return to service.
    idle: bool = False  # Its node's GPUs had no work in the rules' stake window when it began.


@dataclass
class Work:
    """Planned work: the nodes (or the leaf) it covers, from its declaration to the nodes' return, in production
    minutes; `fleet` for work on every node (an exporter upgrade, a Prometheus restart)."""

    name: str
    begin: float
    finish: float
    nodes: tuple[str, ...] = ()
    leaf: str = ""
    fleet: bool = False
    claims: tuple[str, ...] = ()  # Alerts it explains wherever and whenever they fire after it began.


@dataclass(order=True)
class Step:
    at: float  # Production minutes.
    what: str = field(compare=False)
    act: Callable[[Running], None] = field(compare=False)


@dataclass
class Times:
    """Where each piece of the timeline falls, in production minutes (`hours`: the whole of it)."""

    hours: float = 3.0
    warm: float = 15.0  # The signal windows fill; nothing is judged before.
    kinds_minutes: float = 20.0
    exporter_upgrade: float = 40.0
    upgrade: float = 50.0  # The first batch of the driver rollout; one batch every `batch_every`.
    batch_every: float = 11.0
    rma: float = 55.0
    rma_minutes: float = 90.0  # Past the pager's hourly repeat_interval.
    prometheus_restart: float = 80.0
    leaf: float = 110.0
    leaf_minutes: float = 20.0
    removal: float = 140.0
    maintenance_fault: float = 160.0
    overdue: float | None = 60.0  # A maintenance reservation that its drain outlives; None: none.
    draws_until: float = 165.0  # The profile's faults start between `warm` and this.


@dataclass
class Week:
    nodes: int = 250
    # Production's 15 s scrape interval at two fifths of its time: 250 nodes scraped every 6 s ask two CPUs as
    # much as 125 every 3 s, and the engine keeps up; faster, its lag reads as pages that flap (`Health`).
    time_scale: float = 2.5
    interval: str = "6s"  # Collection and scrape interval, wall time.
    seed: int = 1
    times: Times = field(default_factory=Times)
    kinds: int = len(incidents.KINDS)  # The first this many of `incidents.KINDS`, each on a node of its own.
    upgrade_share: float = 0.1  # Of the fleet, in batches of `upgrade_batch`.
    upgrade_batch: int = 5
    leaf_size: int = 16
    rack_size: int = 4
    days: float = 7.0  # The profile's faults: as many as this many days of the fleet draw.
    jobs: tuple[int, ...] = (32, 32, 16, 16, 16, 8, 8, 8, 8, 4, 4, 4, 4)
    job_lifetime: float = 120.0  # Production minutes.
    restarts_per_node_day: float = 6.0
    missed_scrapes: float = 0.005
    # Production seconds between the jobs' synchronous checkpoints (about: each job draws its own) and how long
    # each stops its job (`detection.layout`): planned work that must page nobody. None: no job writes one.
    checkpoint: tuple[float, float] | None = (1800.0, 60.0)


def short() -> Week:
    """CI's week: 16 nodes at time scale 16 for 45 production minutes; five fault kinds, a batch of two nodes
    upgraded, a short RMA, a leaf's firmware, the exporters and Prometheus restarted, a GPU removed and a fault on a
    node in maintenance; no profile draws, and no maintenance reservation outlived (it takes hours)."""
    times = Times(hours=0.75, warm=8.0, kinds_minutes=12.0, exporter_upgrade=10.0, upgrade=12.0, rma=12.0,
                  rma_minutes=20.0, prometheus_restart=22.0, leaf=20.0, leaf_minutes=6.0, removal=30.0,
                  maintenance_fault=24.0, overdue=None, draws_until=0.0)
    return Week(nodes=16, time_scale=16.0, interval="1s", times=times, kinds=5, upgrade_share=0.125,
                upgrade_batch=2, leaf_size=4, days=0.0, jobs=(4, 4, 4), job_lifetime=30.0)


@dataclass
class Plan:
    faults: list[Fault]
    works: list[Work]
    steps: list[Step]
    topology: dict[str, dict[str, str]]
    slurm_nodes: list[str]


def names(count: int) -> list[str]:
    return [f"gpu-node-{number:04d}" for number in range(1, count + 1)]


def plan(week: Week) -> Plan:
    """Every fault and every step of planned work, on nodes drawn from the seed, none of them shared."""
    rng = random.Random(f"oncall:{week.seed}")
    nodes = names(week.nodes)
    topology = {name: {"rack": f"r{i // week.rack_size + 1:03d}", "leaf": f"su{i // week.leaf_size + 1:02d}"}
                for i, name in enumerate(nodes)}
    leaf = rng.choice(sorted({place["leaf"] for place in topology.values()}))
    pool = [name for name in nodes if topology[name]["leaf"] != leaf]
    rng.shuffle(pool)

    def take(count: int) -> list[str]:
        return [pool.pop() for _ in range(count)]

    t, w = week.times, Builder(week)
    upgraded = take(max(1, round(week.upgrade_share * week.nodes)))
    rma, removed, faulty, overdue = take(1)[0], take(1)[0], take(1)[0], take(1)[0] if t.overdue else ""
    w.kinds_round(incidents.apart(week.kinds, pool, [job["nodes"] for job in layout(list(week.jobs), week.seed)[1]]))
    w.exporter_upgrade(nodes)
    w.driver_upgrade(upgraded)
    w.rma(rma)
    w.prometheus_restart()
    w.leaf(leaf, [name for name in nodes if topology[name]["leaf"] == leaf])
    w.removal(removed)
    w.maintenance_fault(faulty)
    if overdue:
        w.overdue(overdue)
    w.draws(nodes, pool, rng)
    slurm_nodes = sorted({*upgraded, rma, faulty, *([overdue] if overdue else [])})
    return Plan(w.faults, w.works, sorted(w.steps), topology, slurm_nodes)


class Builder:
    """The plan's faults, works and steps, piece by piece (`plan`)."""

    def __init__(self, week: Week) -> None:
        self.week, self.t = week, week.times
        self.faults: list[Fault] = []
        self.works: list[Work] = []
        self.steps: list[Step] = []

    def wall(self, minutes: float) -> str:
        """Production minutes as the simulator's (wall) duration."""
        return f"{max(1, round(minutes * 60_000 / self.week.time_scale))}ms"

    def step(self, at: float, what: str, act: Callable[[Running], None]) -> None:
        self.steps.append(Step(at, what, act))

    def slurm(self, nodes: list[str], *settings: str) -> Callable[[Running], None]:
        """A step's `scontrol update` of `nodes`."""
        return lambda run: run.scontrol(nodes, *settings)

    def inject(self, at: float, body: dict[str, Any], what: str) -> None:
        self.step(at, what, lambda run: run.fault(body))

    def fault(self, fault: Fault) -> None:
        self.faults.append(fault)
        # A kind that gives its own duration (a reboot into another driver) keeps it.
        body = {"duration": self.wall(fault.minutes), **fault.injected.fault, "node": fault.injected.node}
        self.step(fault.at, f"fault {fault.injected.kind} on {fault.injected.node} ({fault.cause})",
                  lambda run: run.start(fault, body))

    def kinds_round(self, nodes: list[str]) -> None:
        for (body, pages), node in zip(incidents.KINDS[:len(nodes)], nodes, strict=True):
            self.fault(Fault(Injected(body, pages, node), self.t.warm, self.t.kinds_minutes, "every kind",
                             "page" if pages else "no page"))
            for repair, share in [incidents.REPAIRS[body["kind"]]] if body["kind"] in incidents.REPAIRS else []:
                self.inject(self.t.warm + share * self.t.kinds_minutes, {**repair, "node": node},
                            f"{repair['kind']} of {node}, which does not mend it")

    def exporter_upgrade(self, nodes: list[str]) -> None:
        """Every exporter restarted, one after another over ten production minutes: no maintenance needed."""
        begin = self.t.exporter_upgrade
        self.works.append(Work("exporter upgrade", begin, begin + 10, fleet=True))
        for number, node in enumerate(nodes):
            self.inject(begin + 10 * number / len(nodes), {"kind": "exporter_restart", "node": node,
                                                            "duration": self.wall(20 / 60)}, "")

    def driver_upgrade(self, nodes: list[str]) -> None:
        """A rolling driver upgrade in batches: each node drained with an upgrade reason, its driver unloaded (NVML
        fails as a whole), rebooted into the new driver, verified and resumed."""
        batches = [nodes[i:i + self.week.upgrade_batch] for i in range(0, len(nodes), self.week.upgrade_batch)]
        for number, batch in enumerate(batches):
            at = self.t.upgrade + number * self.t.batch_every
            self.works.append(Work(f"driver upgrade, batch {number + 1}", at, at + 10, tuple(batch),
                                   claims=("NodeVersionsMixed", "JobVersionsMixed")))
            self.step(at, f"drain {', '.join(batch)} for the driver upgrade",
                      self.slurm(batch, "State=DRAIN", "Reason=upgrade: driver 580.95.05"))
            for node in batch:
                self.inject(at + 2, {"kind": "driver_hang", "node": node, "duration": self.wall(2)}, "")
                self.inject(at + 4, {"kind": "driver_mismatch", "node": node, "duration": self.wall(3)}, "")
            self.step(at + 10, f"resume {', '.join(batch)}", self.slurm(batch, "State=RESUME"))

    def rma(self, node: str) -> None:
        """A node drained for an RMA, powered off for hours (its slurmd silent too), a new board fitted, booted
        (exporter and slurmd back together), verified and resumed."""
        at, minutes = self.t.rma, self.t.rma_minutes
        self.works.append(Work("RMA", at, at + minutes + 6, (node,)))
        self.step(at, f"{node} drained for an RMA", self.slurm([node], "State=DRAIN", "Reason=RMA 5120: GPU 3"))
        self.step(at + 1, f"{node} powered off", lambda run: self.off(run, node, minutes))
        self.inject(at + 1 + minutes, {"kind": "gpu_replace", "node": node, "gpu": 3, "duration": self.wall(1)},
                    f"{node} booted with a new GPU 3")
        self.step(at + 2 + minutes, "", lambda run: run.power(node, on=True))
        self.step(at + minutes + 6, f"resume {node}", self.slurm([node], "State=RESUME"))

    def off(self, run: Running, node: str, minutes: float) -> None:
        run.power(node, on=False)
        run.fault({"kind": "exporter_down", "node": node, "duration": self.wall(minutes)})

    def prometheus_restart(self) -> None:
        at = self.t.prometheus_restart
        self.works.append(Work("Prometheus restart", at, at + 10, fleet=True))
        self.step(at, "restart Prometheus", lambda run: run.restart_prometheus())

    def leaf(self, leaf: str, nodes: list[str]) -> None:
        """A leaf switch's firmware upgrade under a `gpufleet maintenance` silence of the leaf."""
        at, minutes = self.t.leaf, self.t.leaf_minutes
        self.works.append(Work(f"leaf {leaf} firmware", at, at + minutes + 8, tuple(nodes), leaf))
        self.step(at, f"maintenance of leaf {leaf}", lambda run: run.maintenance(
            "start", f"--leaf={leaf}", "--reason=leaf firmware 3.2", f"--for={self.wall(2 * 60)}"))
        self.inject(at + 2, {"kind": "switch_down", "leaf": leaf, "duration": self.wall(minutes)}, "")
        self.step(at + minutes + 8, f"end the maintenance of leaf {leaf}",
                  lambda run: run.maintenance("end", f"--leaf={leaf}"))

    def removal(self, node: str) -> None:
        """A GPU taken out on purpose, under a silence of the node."""
        at = self.t.removal
        self.works.append(Work("GPU removal", at, at + 15, (node,)))
        self.step(at, f"maintenance of {node}", lambda run: run.maintenance(
            "start", f"--node={node}", "--reason=GPU 7 to the spares pool", f"--for={self.wall(60)}"))
        self.inject(at + 1, {"kind": "gpu_removed", "node": node, "gpu": 7, "duration": self.wall(2.5)}, "")
        self.step(at + 15, f"end the maintenance of {node}", lambda run: run.maintenance("end", f"--node={node}"))

    def maintenance_fault(self, node: str) -> None:
        """A node drained for a BIOS update whose GPU does not come back from the reboot: it must page once the
        node returns to service, and not before."""
        at = self.t.maintenance_fault
        back = at + 8
        self.works.append(Work("BIOS update", at, back, (node,)))
        self.step(at, f"drain {node} for a BIOS update",
                  self.slurm([node], "State=DRAIN", "Reason=maintenance: BIOS 2.7"))
        self.inject(at + 1, {"kind": "node_reboot", "node": node, "duration": self.wall(2)}, "")
        remaining = self.t.hours * 60 - (at + 2)
        self.fault(Fault(Injected({"kind": "gpu_dead", "gpu": 2}, True, node), at + 2, remaining,
                         "a fault under maintenance", "page", returns=back))
        self.step(back, f"resume {node}", self.slurm([node], "State=RESUME"))

    def overdue(self, node: str) -> None:
        """A maintenance reservation whose drain outlives it: the work runs late, and nobody returns the node."""
        at = self.t.overdue or 0.0
        wall_minutes = max(1, math.ceil(30 / self.week.time_scale))
        end = at + wall_minutes * self.week.time_scale
        self.works.append(Work("firmware, overdue", at, end + 65, (node,)))
        self.step(at, f"maintenance reservation on {node}", lambda run: run.reserve(node, wall_minutes))
        self.step(at + 1, f"drain {node} for the work",
                  self.slurm([node], "State=DRAIN", "Reason=maintenance: HCA firmware"))
        self.inject(at + 2, {"kind": "node_reboot", "node": node, "duration": self.wall(3)}, "")
        self.step(end + 65, f"resume {node}", self.slurm([node], "State=RESUME"))

    def draws(self, nodes: list[str], pool: list[str], rng: random.Random) -> None:
        """The faults `days` of the whole fleet draws from the Llama 3 profile, each moved to a time of its own
        between the round and `draws_until`, on a node of its own from `pool`; the profile's GSP timeouts (XID 119)
        are hung drivers."""
        if not self.week.days:
            return
        units = {name: list(PORTS) for name in nodes}
        drawn = draw(load_rates(PROFILE.read_text()), units, 8, self.week.days * 86400, self.week.seed,
                     itertools.count())
        span = self.t.draws_until - self.t.warm
        end = self.t.hours * 60 - 1
        free = list(pool)
        for raw in drawn[:len(free)]:
            at = self.t.warm + span * raw.start / (self.week.days * 86400)
            node = free.pop(rng.randrange(len(free)))
            kind = "driver_hang" if raw.xid == 119 else str(raw.kind)
            label = f"xid {raw.xid}" if kind == "xid" else kind
            body: dict[str, Any] = {"kind": kind}
            if kind not in ("exporter_down", "driver_hang"):
                body.update({"gpu": raw.gpu} if raw.port is None else {"port": raw.port})
            if kind == "xid":
                body["xid"] = raw.xid
            minutes = min((raw.duration or 600) / 60, end - at)
            self.fault(Fault(Injected(body, DRAWN[label] == "page", node), at, minutes, "Llama 3 profile",
                             DRAWN[label]))
