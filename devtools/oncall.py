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
"""

from __future__ import annotations

import contextlib
import getpass
import io
import itertools
import math
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpufleet import cli, duration
from gpufleet import simulator as simulator_package
from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools import incidents
from gpufleet.devtools.delivery import Receiver, routing
from gpufleet.devtools.detection import layout, restart_rates
from gpufleet.devtools.incidents import Injected
from gpufleet.devtools.net import free_port, http
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import alertmanager, prometheus, prometheus_config, remediator, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.slurm import Slurm, slurm
from gpufleet.devtools.waiting import HarnessError, wait_for
from gpufleet.simulator.rates import draw, load_rates

PROFILE = Path(simulator_package.__file__).parent / "fault-rates" / "llama3.yml"
PORTS = tuple(f"mlx5_{n}/1" for n in range(8))
# What each kind the profile draws should bring: a page, a ticket, or nothing (an application's own XID).
DRAWN = {"gpu_lost": "page", "ecc_dbe": "page", "xid 13": "none", "ib_link_down": "page", "exporter_down": "page",
         "xid 95": "page", "driver_hang": "page", "thermal_slowdown": "ticket"}
PROMETHEUS_TIMERS = {"--rules.alert.for-grace-period": "10m", "--rules.alert.resend-delay": "1m"}


@dataclass
class Fault:
    """A real fault: the simulator's body, what should reach people (`expect`: page; ticket; none, for an
    application's own error; no page, for a kind that tickets or only informs), and, for one on a node in
    maintenance, when the node returns and may page."""

    injected: Injected
    at: float  # Production minutes from the start.
    minutes: float
    cause: str
    expect: str
    returns: float | None = None  # Production minutes: the node's return to service.


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

    hours: float = 4.5
    warm: float = 15.0  # The signal windows fill; nothing is judged before.
    kinds_minutes: float = 20.0
    exporter_upgrade: float = 40.0
    upgrade: float = 50.0  # The first batch of the driver rollout; one batch every `batch_every`.
    batch_every: float = 11.0
    rma: float = 55.0
    rma_minutes: float = 150.0
    prometheus_restart: float = 80.0
    leaf: float = 110.0
    leaf_minutes: float = 20.0
    removal: float = 140.0
    maintenance_fault: float = 160.0
    overdue: float | None = 170.0  # A maintenance reservation that its drain outlives; None: none.
    draws_until: float = 200.0  # The profile's faults start between `warm` and this.


@dataclass
class Week:
    nodes: int = 250
    # Production's 15 s scrape interval at a fifth of its time: a faster week of 250 nodes asks more of two CPUs
    # than they have, and the engine's lag then reads as pages that flap (`Health`).
    time_scale: float = 5.0
    interval: str = "3s"  # Collection and scrape interval, wall time.
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
    w.kinds_round(take(week.kinds))
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


@dataclass
class Health:
    """Whether the engine kept up, which the week's figures mean nothing without: the slowest evaluation of any rule
    group as a share of its interval, the evaluations it skipped, and the share of scrapes that failed."""

    worst_evaluation: float = 0.0
    missed_evaluations: int = 0
    failed_scrapes: float = 0.0

    def line(self) -> str:
        return (f"Engine: slowest rule group evaluation {self.worst_evaluation:.0%} of its interval, "
                f"{self.missed_evaluations} evaluations skipped, {self.failed_scrapes:.2%} of node scrapes failed.")


@dataclass
class Running:
    """The programs of a running week, and the actions the plan's steps take on them."""

    week: Week
    cluster: Slurm
    sim_url: str
    am_url: str
    prom_url: str
    restart: Callable[[], str]
    t0: float = 0.0  # Monotonic seconds of production minute 0.
    log: list[str] = field(default_factory=list)
    health: Health = field(default_factory=Health)

    def at(self, minutes: float) -> float:
        return self.t0 + minutes * 60 / self.week.time_scale

    def fault(self, body: dict[str, Any]) -> None:
        status, answer = http("POST", f"{self.sim_url}/control/faults", body)
        if status != 201:
            raise HarnessError(f"the simulator refused {body}: {status} {answer!r}")

    def start(self, fault: Fault, body: dict[str, Any]) -> None:
        """A real fault, with the job a hang stops (none on an idle node: a hang there pages nobody)."""
        injected = fault.injected
        if injected.kind in ("job_hang", "driver_hang"):
            found = query(self.prom_url, f'group by (job_id) (gpufleet_gpu_job_info{{instance="{injected.node}",'
                                         'job_id!=""})')
            job = found[0]["metric"]["job_id"] if found else ""
            injected.job = job if injected.kind == "job_hang" else ""
            if not job:
                injected.pages, fault.expect = False, "no page"
        self.fault(body)
        injected.start = self.at(fault.at)
        injected.end = self.at(fault.at + fault.minutes)

    def scontrol(self, nodes: list[str], *settings: str) -> None:
        """`scontrol update`, as a person types it: a refusal (resuming a node Slurm has already returned) is
        logged, and the week goes on."""
        try:
            self.cluster.run("scontrol", "update", f"NodeName={','.join(nodes)}", *settings)
        except HarnessError as err:
            self.log.append(str(err))

    def power(self, node: str, on: bool) -> None:
        """A node powered off (its slurmd stops answering the controller, as a host that is off does) or on."""
        subprocess.run(["pkill", "-CONT" if on else "-STOP", "-f", f"slurmd -D -N {node}$"], check=False, timeout=10)

    def reserve(self, node: str, wall_minutes: int) -> None:
        self.cluster.run("scontrol", "create", "reservation", f"ReservationName=work-{node}", "StartTime=now",
                         f"Duration={wall_minutes}", f"Nodes={node}", "Flags=MAINT", f"Users={getpass.getuser()}")

    def maintenance(self, *args: str) -> None:
        """`gpufleet maintenance`, as the runbooks give it; its output goes to the week's log."""
        out = io.StringIO()
        author = ["--author=oncall-week"] if args[0] == "start" else []
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = cli.main(["maintenance", *args, f"--alertmanager.url={self.am_url}", *author])
            except SystemExit as exit:  # argparse's refusal of a flag.
                status = exit.code if isinstance(exit.code, int) else 2
        if status != 0:
            raise HarnessError(f"gpufleet maintenance {' '.join(args)} exited {status}: {out.getvalue()}")
        self.log.append(out.getvalue().strip())

    def restart_prometheus(self) -> None:
        self.prom_url = self.restart()

    def check_engine(self, seconds: int) -> None:
        """`health`, from Prometheus's own series over the last `seconds` (it scrapes itself)."""
        def number(promql: str) -> float:
            found = query(self.prom_url, promql)
            return float(found[0]["value"][1]) if found else 0.0

        self.health = Health(
            number(f"max(max_over_time(prometheus_rule_group_last_duration_seconds[{seconds}s]) "
                   "/ prometheus_rule_group_interval_seconds)"),
            round(number(f"sum(increase(prometheus_rule_group_iterations_missed_total[{seconds}s]))")),
            1 - number(f'sum(sum_over_time(up{{job="gpufleet"}}[{seconds}s])) '
                       f'/ sum(count_over_time(up{{job="gpufleet"}}[{seconds}s]))'))


def prometheus_flags(scale: float) -> list[str]:
    return [f"{flag}={duration.render(max(1, round(duration.parse(value) / scale)))}"
            for flag, value in PROMETHEUS_TIMERS.items()]


@contextlib.contextmanager
def stack(week: Week, the_plan: Plan, work: Path, receiver: Receiver) -> Iterator[Running]:
    """Every program of the week, running; yields once Prometheus scrapes every node and the remediator."""
    scale = week.time_scale
    (work / "rules.yml").write_text(render(Config().scaled(scale)))
    sizes, jobs = layout(list(week.jobs), week.seed)
    if sizes > week.nodes:
        raise HarnessError(f"jobs of {week.jobs} need {sizes} nodes; the week has {week.nodes}")
    (work / "layout.yml").write_text(yaml.safe_dump({"jobs": jobs}))
    (work / "topology.yml").write_text(yaml.safe_dump({"nodes": the_plan.topology}))
    restart_rates(work / "restarts.yml", week.restarts_per_node_day, scale)
    horizon = round(week.times.hours * 3600 / scale) + 120
    targets = work / "targets.json"
    with contextlib.ExitStack() as programs:
        cluster = programs.enter_context(slurm(work / "slurm", the_plan.slurm_nodes,
                                               daemons=len(the_plan.slurm_nodes)))
        remediate = programs.enter_context(remediator(cluster.env, "--slurm.list-interval=1s"))
        am = programs.enter_context(alertmanager(work / "am", routing(work, receiver, scale)))
        sim = programs.enter_context(simulator(
            targets, f"--nodes={week.nodes}", f"--seed={week.seed}", f"--layout={work / 'layout.yml'}",
            f"--topology={work / 'topology.yml'}", "--cluster=week", f"--collect-interval={week.interval}",
            f"--fault-rates={work / 'restarts.yml'}", f"--fault-rates.horizon={horizon}s",
            f"--missed-scrapes={week.missed_scrapes}", f"--job-lifetime={round(week.job_lifetime * 60 / scale)}s",
            "--storage-hca"))
        port = free_port()
        config = prometheus_config(work / "prometheus.yml", targets, week.interval, work / "rules.yml", am.url,
                                   own={"gpufleet-remediate": int(remediate.url.rsplit(":", 1)[1]),
                                        "prometheus": port}, own_cluster="week")
        engine = contextlib.ExitStack()
        programs.callback(engine.close)

        def start_prometheus() -> Server:
            return engine.enter_context(prometheus(config, work / "data", port=port, flags=prometheus_flags(scale)))

        prom = start_prometheus()

        def restart() -> str:
            engine.close()
            return start_prometheus().url

        wait_for(lambda: len(query(prom.url, "up == 1")) >= week.nodes + 2, 120,
                 "every node, the remediator and Prometheus up")
        yield Running(week, cluster, sim.url, am.url, prom.url, restart)


def run(week: Week) -> tuple[Plan, Running, Receiver, float]:
    """The week in the real programs: every step at its time. Returns the plan, the run, what was delivered, and
    the monotonic time the run ended."""
    the_plan = plan(week)
    receiver = Receiver()
    with tempfile.TemporaryDirectory(prefix="oncall-") as tmp, stack(week, the_plan, Path(tmp), receiver) as running:
        running.t0 = time.monotonic()
        print(f"{week.nodes} nodes, time scale {week.time_scale:g}: {week.times.hours:g} production hours, "
              f"{len(the_plan.faults)} faults, {len(the_plan.works)} pieces of planned work", file=sys.stderr)
        for step in the_plan.steps:
            time.sleep(max(0.0, running.at(step.at) - time.monotonic()))
            step.act(running)
            if step.what:
                print(f"{step.at:6.1f} min  {step.what}", file=sys.stderr)
        time.sleep(max(0.0, running.at(week.times.hours * 60) - time.monotonic()))
        running.check_engine(round(time.monotonic() - running.t0))
        return the_plan, running, receiver, time.monotonic()


def with_times(week: Week, **changes: Any) -> Week:
    return replace(week, times=replace(week.times, **changes))
