"""The on-call week running: its programs (`stack`), the actions its steps take on them (`Running`), and whether
the engine kept up (`Health`). The week itself, and its plan, are `oncall`'s.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet import cli, duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import NODE_WORK
from gpufleet.alerts.rules import render
from gpufleet.devtools import incidents
from gpufleet.devtools.delivery import Receiver, routing
from gpufleet.devtools.detection import in_simulator, layout, restart_rates
from gpufleet.devtools.net import free_port, http
from gpufleet.devtools.oncall import PROMETHEUS_TIMERS, Fault, Plan, Week, plan
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import alertmanager, prometheus, prometheus_config, remediator, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.slurm import Slurm, slurm
from gpufleet.devtools.waiting import HarnessError, wait_for


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

    def minutes(self, at: float) -> float:
        """Production minutes from the start at monotonic time `at`: `at`'s inverse."""
        return (at - self.t0) * self.week.time_scale / 60

    def fault(self, body: dict[str, Any]) -> None:
        status, answer = http("POST", f"{self.sim_url}/control/faults", body)
        if status != 201:
            raise HarnessError(f"the simulator refused {body}: {status} {answer!r}")

    def start(self, fault: Fault, body: dict[str, Any]) -> None:
        """A real fault, with whether a hang should page (`incidents.hang_at_stake`), and whether its node's GPUs
        had work as the rules read it."""
        injected = fault.injected
        fault.idle = not query(self.prom_url, f'{NODE_WORK}{{instance="{injected.node}"}}')
        if incidents.hang_at_stake(self.prom_url, injected):
            fault.expect = "no page"
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
    sizes, jobs = layout(list(week.jobs), week.seed, checkpoint=in_simulator(week.checkpoint, scale))
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
