"""How small a straggler the rules find, how soon, and how often they are wrong: the detection sweep that
`bench/detection_bench.py` runs at length and CI runs short (`short()`).

Real programs: the fleet simulator, Prometheus with the rules generated at the sweep's time scale (every
window and `for` divided by it, thresholds unchanged) and Alertmanager with the production routing,
delivering to a receiver here. The fleet runs Slurm jobs of the sweep's sizes, with training steps of 34
to 54 production seconds. Each round injects one straggler into every job, each a (cause, slowdown) case
drawn for the job's size, on a node drawn from the seed; the faults last `fault_minutes`, then the round
waits `settle_minutes` for the alerts to resolve. A sweep of no cases runs a healthy fleet that moves as
a real one does: jobs end and new ones take most of their nodes, exporters restart, and a share of
scrapes fails; every alert that fires then is false. The first 10 production minutes, while the signal
windows fill, are neither judged nor counted as healthy node-hours.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools import incidents
from gpufleet.devtools.delivery import AlertLog, Receiver, routing
from gpufleet.devtools.net import http
from gpufleet.devtools.programs import alertmanager, prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import HarnessError
from gpufleet.exporter.gpu.simulated.host import random_uuid
from gpufleet.simulator.faults import Cause

# The jobs' training steps, in production seconds: a few to a window, as `docs/alerts/stragglers.md` says a window
# must hold (real steps are shorter, and hold more).
STEPS = (34.4, 53.6)
# What names each cause in the alert's description, and the alerts of the cause itself, on the same node (a
# straggler held back by heat heats every GPU of its node: the node's cooling alert, which stands in for each
# GPU's).
NAMED = {Cause.CLOCK: "none of", Cause.THERMAL: "thermal slowdown", Cause.POWER: "power brake",
         Cause.NIC: "NIC congestion", Cause.PCIE: "PCIe degraded", Cause.HOST: "GPUs idle between steps"}
OWN_ALERTS = {Cause.THERMAL: {"GpuThermalMarginLow", "NodeThermalMarginLow"}, Cause.POWER: {"GpuHardwareSlowdown"},
              Cause.NIC: {"NicInfinibandCongested"}, Cause.PCIE: {"GpuPcieLinkDegraded"}}


@dataclass
class Case:
    cause: Cause
    slowdown: float
    job_size: int
    node: str = ""
    start: float = 0.0  # Monotonic seconds.
    end: float = 0.0
    detected: float | None = None  # Production minutes from start to first firing.
    resolved: float | None = None  # Production minutes from end to the last firing seen.
    named: bool = False


@dataclass
class Tally:
    alerts: int = 0
    explained: int = 0
    false: list[str] = field(default_factory=list)


def in_simulator(checkpoint: tuple[float, float] | None, scale: float) -> tuple[float, float] | None:
    """A checkpoint's production seconds (every, lasts) as the simulator's at time scale `scale`, for `layout`."""
    return None if checkpoint is None else (checkpoint[0] / scale, checkpoint[1] / scale)


def layout(sizes: list[int], seed: int, scheduler: str = "slurm", periods: tuple[float, float] = (4.3, 6.7),
           checkpoint: tuple[float, float] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The fleet's jobs, one of each size, all of one scheduler or, `mixed`, Slurm and Kubernetes in turn, each
    with a training step drawn from `periods` (simulator seconds).
    Kubernetes jobs are pods the simulator cannot name (no kubelet answers it), so they have no job id and their
    nodes are compared by GPU model across the different jobs. With `checkpoint` (every, lasts; simulator
    seconds), every job stops to write checkpoints, at an interval of its own drawn around `every`: every rank
    its shard in one job, the first node alone while the others wait in the next, in turn."""
    rng = random.Random(f"layout:{seed}")
    jobs: list[dict[str, Any]] = []
    first = 1
    for number, size in enumerate(sizes):
        nodes = [f"gpu-node-{i:04d}" for i in range(first, first + size)]
        first += size
        kubernetes = scheduler == "kubernetes" or (scheduler == "mixed" and number % 2 == 1)
        job_id = random_uuid(rng) if kubernetes else str(700000 + number)
        jobs.append({"id": job_id, "scheduler": "kubernetes" if kubernetes else "slurm", "nodes": nodes,
                     "period": round(rng.uniform(*periods), 2), "comm_fraction": round(rng.uniform(0.2, 0.35), 2)})
        if checkpoint is not None:
            every, lasts = checkpoint
            # From a generator of its own, so that a seed lays out the same jobs with checkpoints as without.
            drawn = every * random.Random(f"checkpoint:{seed}:{number}").uniform(0.5, 1.5)
            jobs[-1]["checkpoint"] = {"every": round(drawn, 2), "lasts": round(lasts, 2),
                                      "writers": ("all", "first")[number % 2]}
    return first - 1, jobs


def cases(pairs: list[tuple[Cause, float]], sizes: list[int], seeds: int) -> dict[int, list[Case]]:
    """Every case to run, queued by job size: each (cause, slowdown) once per seed in each size of job."""
    queues: dict[int, list[Case]] = {}
    for size in sorted(set(sizes)):
        queue = [Case(cause, slowdown, size) for _ in range(seeds) for cause, slowdown in pairs]
        random.Random(f"cases:{size}").shuffle(queue)
        queues[size] = queue
    return queues


def restart_rates(path: Path, per_node_day: float, scale: float) -> None:
    """A fault-rates file of exporter restarts, in the simulator's (wall) time: `scale` times as frequent and
    as short as in production."""
    rate = {"cause": "exporter restart", "kind": "exporter_restart", "per": "node",
            "rate": per_node_day * scale, "duration": f"{round(20_000 / scale)}ms"}
    path.write_text(yaml.safe_dump({"faults": [rate]}))


def movement(sim_url: str, prom_url: str, seconds: int) -> str:
    """What moved in the fleet, so a quiet run shows it was not quiet for want of anything happening."""
    _, body = http("GET", f"{sim_url}/control/faults")
    listing = json.loads(body)
    restarts = sum(1 for f in listing["faults"] if f["kind"] == "exporter_restart" and f["start"] <= listing["now"])

    def number(promql: str) -> int:
        result = query(prom_url, promql)
        return round(float(result[0]["value"][1])) if result else 0

    jobs = number(f"count(count by (job_id) (last_over_time(gpufleet_gpu_job_info[{seconds}s])))")
    scrapes = number(f"sum(count_over_time(up[{seconds}s]))")
    failed = scrapes - number(f"sum(sum_over_time(up[{seconds}s]))")
    return (f"Moving fleet: {jobs} job ids seen, {restarts} exporter restarts, {failed} of {scrapes} scrapes "
            "failed (restarts and missed scrapes).")


def rounds(jobs: list[dict[str, Any]], queues: dict[int, list[Case]], seed: int) -> Iterator[list[Case]]:
    rng = random.Random(f"nodes:{seed}")
    while any(queues.values()):
        batch = []
        for job in jobs:
            queue = queues[len(job["nodes"])]
            if queue:
                case = queue.pop()
                case.node = rng.choice(job["nodes"])
                batch.append(case)
        yield batch


def post(url: str, case: Case, seconds: float) -> None:
    status, body = http("POST", f"{url}/control/faults",
                        {"kind": "straggler", "node": case.node, "slowdown": case.slowdown,
                         "cause": str(case.cause), "duration": seconds})
    if status != 201:
        raise HarnessError(f"the simulator refused a fault: {status} {body!r}")


def explains(labels: dict[str, str], first: float, last: float, done: list[Case], scale: float,
             round_: list[incidents.Injected], removed: set[str]) -> bool:
    """Whether a fault explains an alert episode: one on the alert's node that overlaps it, allowing the
    alert to resolve up to 10 production minutes after the fault's end (the resolved signals' window, the
    other rules' longer windows, and the scrapes between). A fault of the
    kinds round explains any alert of its own (`Injected.caused`) that began while it lasted; a GPU taken out
    on purpose, the inventory ticket for its node."""
    grace = 600 / scale
    if any(f.caused(labels) and f.start <= first <= f.end + grace for f in round_):
        return True
    if labels.get("alertname") == "GpuCountDropped" and labels.get("instance") in removed:
        return True
    for case in done:
        if case.node != labels.get("instance") or not (case.start <= last and first <= case.end + grace):
            continue
        if labels.get("alertname") == "NodeStraggler" or labels.get("alertname") in OWN_ALERTS.get(case.cause, ()):
            return True
    return False


def judge(log: AlertLog, done: list[Case], scale: float, since: float, began: float,
          round_: list[incidents.Injected], removed: set[str]) -> Tally:
    """Every alert episode after `since`, explained by a fault or false; a false one is told with the production
    minutes of the run it fired in (from `began`), to be looked up in the run's data."""
    def minute(at: float) -> str:
        return f"{(at - began) * scale / 60:.1f}"

    tally = Tally()
    for key, spells in log.episodes.items():
        labels = dict(key)
        for first, last in spells:
            if last < since:
                continue
            tally.alerts += 1
            if explains(labels, first, last, done, scale, round_, removed):
                tally.explained += 1
            else:
                tally.false.append(f"{labels.get('alertname')} on {labels.get('instance')} "
                                   f"{ {k: v for k, v in labels.items() if k not in ('alertname', 'instance')} } "
                                   f"from production minute {minute(first)} to {minute(last)}")
    for case in done:
        # Each episode's own description: a node can straggle again in a later round, for another cause.
        straggling = [(spell, told.get("description", "")) for key, spells in log.episodes.items()
                      for spell, told in zip(spells, log.told.get(key, []), strict=False)
                      if dict(key).get("alertname") == "NodeStraggler" and dict(key).get("instance") == case.node
                      and case.start <= spell[0] <= case.end]
        if straggling:
            first_spell = min(spell for spell, _ in straggling)
            case.detected = (first_spell[0] - case.start) * scale / 60
            case.resolved = (max(spell[1] for spell, _ in straggling) - case.end) * scale / 60
            case.named = any(NAMED[case.cause] in description for _, description in straggling)
    return tally


def report(done: list[Case], tally: Tally, healthy_node_hours: float, config: Config) -> str:
    window, for_ = config.signal_window, config.straggler_for
    lines = [f"Straggler detection: {len(done)} stragglers; production minutes (signal window {window}, for {for_})",
             "", "| cause | slowdown | job size | found | cause named | detect p50 / max | resolve max |",
             "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, float, int], list[Case]] = defaultdict(list)
    for case in done:
        groups[(case.cause, case.slowdown, case.job_size)].append(case)
    for (cause, slowdown, size), group in sorted(groups.items()):
        found = [c for c in group if c.detected is not None]
        detect = [c.detected for c in found if c.detected is not None]
        resolve = [c.resolved for c in found if c.resolved is not None]
        lines.append(f"| {cause} | {slowdown:.0%} | {size} | {len(found)}/{len(group)} | "
                     f"{sum(c.named for c in found)}/{len(found)} | "
                     + (f"{statistics.median(detect):.1f} / {max(detect):.1f} | {max(resolve):.1f} |" if found
                        else "- | - |"))
    by_cause: dict[str, list[Case]] = defaultdict(list)
    for case in done:
        by_cause[f"{case.cause} {case.slowdown:.0%}"].append(case)
    lines += ["", "| cause and slowdown | recall (all job sizes) |", "|---|---|"]
    lines += [f"| {name} | {sum(c.detected is not None for c in group) / len(group):.2f} |"
              for name, group in sorted(by_cause.items())]
    precision = tally.explained / tally.alerts if tally.alerts else 1.0
    rate = 1000 * len(tally.false) / healthy_node_hours if healthy_node_hours else 0.0
    lines += ["", f"Alerts that fired: {tally.alerts}; explained by a fault: {tally.explained} "
                  f"(precision {precision:.3f}). False alerts: {len(tally.false)} in {healthy_node_hours:.0f} "
                  f"healthy node-hours ({rate:.2f} per 1,000)."]
    lines += [f"  false: {text}" for text in tally.false]
    return "\n".join(lines)


@dataclass
class Sweep:
    """What one run of the sweep does. `queues` holds the cases to inject per job size; none: a healthy run."""

    sizes: list[int]
    queues: dict[int, list[Case]]
    seed: int = 1
    # Ten, so that every window and `for` of the straggler group (whole minutes) is a whole number of wall seconds
    # (`Config.d` rounds to the second): at 8, the minute group ran every 8 s while its 2-minute window and `for`
    # were 15 s, and a single evaluation's transient could never fire.
    time_scale: float = 10.0
    fault_minutes: float = 12.0  # Production minutes each fault lasts.
    settle_minutes: float = 8.0  # Production minutes between rounds.
    healthy_minutes: float = 60.0  # Production minutes before the first round.
    interval: str = "2s"  # Collection and scrape interval, wall time.
    job_lifetime: float | None = None  # Production minutes a job lasts on average; None: jobs never end.
    scheduler: str = "slurm"  # The jobs' scheduler: "kubernetes" for jobs without ids, or "mixed" (`layout`).
    restarts_per_node_day: float = 6.0
    missed_scrapes: float = 0.005
    # Production seconds between the jobs' synchronous checkpoints (about: each job's own is drawn around it) and
    # how long each stops the job (`layout`), which must page nobody; None: no job stops to write one.
    checkpoint: tuple[float, float] | None = (1800.0, 60.0)
    # After the stragglers, a round of the first `kinds` end-to-end fault kinds (`incidents.KINDS`), each on a
    # node of its own for `kinds_minutes`, counting the pager incidents each opens.
    kinds: int = 0
    kinds_minutes: float = 20.0
    # What a real site has that must page nobody: nodes with an InfiniBand port never cabled (down from the
    # start), a storage HCA of another model at half the training HCAs' rate on every node, and GPUs taken out
    # on purpose (during a reboot of 2.5 production minutes, halfway through the healthy start).
    uncabled: int = 2
    storage_hca: bool = True
    removals: int = 1
    # Where the run's rules, layout and Prometheus data stay, so that what an alert saw can be queried after the
    # run (a Prometheus started on `data`); None: a temporary directory, removed at the end.
    keep: Path | None = None


def short() -> Sweep:
    """CI's sweep: jobs of 4 and 8, one round, a 20 % clock straggler in the first and a NIC one in the second. The
    fault kinds' pages are CI's on-call week's (`oncall.short`). Its jobs write a minute's checkpoint about every
    ten production minutes, so that each writes in the run: every rank at once in the job of 4, the first node
    alone while its peers wait in the job of 8. Neither is a straggler."""
    return Sweep([4, 8], {4: [Case(Cause.CLOCK, 0.2, 4)], 8: [Case(Cause.NIC, 0.2, 8)]},
                 healthy_minutes=12.0, fault_minutes=12.0, settle_minutes=8.0, checkpoint=(600.0, 60.0))


@dataclass
class Outcome:
    """What a sweep found: every case with its figures, the alerts judged, the healthy node-hours they were
    judged over, and what moved in the fleet meanwhile."""

    config: Config
    cases: list[Case]
    tally: Tally
    healthy_node_hours: float
    delivered: int
    movement: str
    round: list[incidents.Injected]
    false_pages: list[str]

    @property
    def found_and_named(self) -> bool:
        return all(c.detected is not None and c.named for c in self.cases)

    def table(self) -> str:
        text = report(self.cases, self.tally, self.healthy_node_hours, self.config)
        if self.round:
            return f"{text}\n\n{incidents.table(self.round, self.false_pages)}"
        return "\n".join([text, "", f"False pages (incidents no fault explains): {len(self.false_pages)}.",
                           *(f"  false page: {page}" for page in self.false_pages)])


def _simulator_flags(sweep: Sweep, work: Path, nodes: int) -> list[str]:
    """The simulated fleet: its layout, and the exporter restarts, missed scrapes and job churn that keep it
    moving over the whole run."""
    scale = sweep.time_scale
    restart_rates(work / "restarts.yml", sweep.restarts_per_node_day, scale)
    rounds_count = max((len(queue) for queue in sweep.queues.values()), default=0)
    horizon = (sweep.healthy_minutes + rounds_count * (sweep.fault_minutes + sweep.settle_minutes)) * 60 / scale
    (work / "site.yml").write_text(yaml.safe_dump({"faults": _site(sweep, nodes)[0]}))
    flags = [f"--nodes={nodes}", f"--seed={sweep.seed}", f"--layout={work / 'layout.yml'}", "--cluster=bench",
             f"--collect-interval={sweep.interval}", f"--fault-rates={work / 'restarts.yml'}",
             f"--fault-rates.horizon={round(horizon) + 60}s", f"--missed-scrapes={sweep.missed_scrapes}",
             f"--scenario={work / 'site.yml'}", *(["--storage-hca"] if sweep.storage_hca else [])]
    if sweep.job_lifetime is not None:
        flags.append(f"--job-lifetime={round(sweep.job_lifetime * 60 / scale)}s")
    return flags


def _site(sweep: Sweep, nodes: int) -> tuple[list[dict[str, Any]], set[str]]:
    """The site's own quirks, drawn from the seed, as simulator faults: the uncabled ports and the GPUs taken
    out; and the nodes those GPUs leave."""
    rng = random.Random(f"site:{sweep.seed}")
    names = [f"gpu-node-{number:04d}" for number in range(1, nodes + 1)]
    uncabled = rng.sample(names, min(sweep.uncabled, nodes))
    removed = rng.sample(names, min(sweep.removals, nodes))
    at = round(sweep.healthy_minutes * 30 / sweep.time_scale)
    faults: list[dict[str, Any]] = [{"kind": "ib_link_down", "node": node, "port": "mlx5_7/1"} for node in uncabled]
    faults += [{"kind": "gpu_removed", "node": node, "gpu": 3, "start": f"{at}s",
                "duration": f"{max(1, round(150 / sweep.time_scale))}s"} for node in removed]
    return faults, set(removed)


def _inject(sweep: Sweep, jobs: list[dict[str, Any]], sim_url: str) -> list[Case]:
    """Every round's stragglers, each round after the last has settled; returns the cases as injected."""
    done: list[Case] = []
    seconds = sweep.fault_minutes * 60 / sweep.time_scale
    for number, batch in enumerate(rounds(jobs, sweep.queues, sweep.seed), 1):
        for case in batch:
            case.start = time.monotonic()
            post(sim_url, case, seconds)
            case.end = case.start + seconds
            done.append(case)
        print(f"round {number}: " + ", ".join(f"{c.cause} {c.slowdown:.0%} on {c.node} (job of {c.job_size})"
                                              for c in batch), file=sys.stderr)
        time.sleep(seconds + sweep.settle_minutes * 60 / sweep.time_scale)
    return done


def run(sweep: Sweep) -> Outcome:
    """Run the sweep in the real programs and judge every alert that fired."""
    scale = sweep.time_scale
    nodes, jobs = layout(sweep.sizes, sweep.seed, sweep.scheduler, (STEPS[0] / scale, STEPS[1] / scale),
                         in_simulator(sweep.checkpoint, scale))
    config = Config().scaled(scale)
    with contextlib.ExitStack() as stack:
        if sweep.keep is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="detection-")))
        else:
            work = sweep.keep
            work.mkdir(parents=True, exist_ok=False)
        (work / "rules.yml").write_text(render(config))
        (work / "layout.yml").write_text(yaml.safe_dump({"jobs": jobs}))
        receiver = Receiver()
        targets = work / "targets.json"
        with simulator(targets, *_simulator_flags(sweep, work, nodes)) as sim, \
                alertmanager(work / "am", routing(work, receiver, scale)) as am, \
                prometheus(prometheus_config(work / "prometheus.yml", targets, sweep.interval, work / "rules.yml",
                                             am.url), work / "data") as prom:
            log = AlertLog(prom.url)
            began = time.monotonic()
            since = began + 600 / scale  # The rules' windows fill: alerts before are not judged.
            print(f"{nodes} nodes in jobs of {sweep.sizes}; healthy for {sweep.healthy_minutes:g} production "
                  "minutes", file=sys.stderr)
            time.sleep(sweep.healthy_minutes * 60 / scale)
            done = _inject(sweep, jobs, sim.url)
            round_ = _kinds_round(sweep, nodes, jobs, sim.url, prom.url)
            log.stop()
            ended = time.monotonic()
            moved = movement(sim.url, prom.url, round(ended - began))
        delivered = len(receiver.snapshot())
        false_pages = incidents.count(round_, receiver, scale, lambda alert, at: _straggling(alert, at, done, scale))
    faulted = sum(min(c.end + 600 / scale, ended) - c.start for c in done)
    faulted += sum(ended - f.start for f in round_)  # Their held alerts last to the end.
    healthy_node_hours = (nodes * (ended - since) - faulted) * scale / 3600
    tally = judge(log, done, scale, since, began, round_, _site(sweep, nodes)[1])
    return Outcome(config, done, tally, healthy_node_hours, delivered, moved, round_, false_pages)


def _straggling(alert: dict[str, str], at: float, done: list[Case], scale: float) -> bool:
    """Whether a page is one of a straggler's: on its node, while it lasted or within 10 production minutes after."""
    return any(c.node == alert.get("instance") and c.start <= at <= c.end + 600 / scale for c in done)


def _kinds_round(sweep: Sweep, nodes: int, jobs: list[dict[str, Any]], sim_url: str,
                 prom_url: str) -> list[incidents.Injected]:
    """The round of fault kinds, once the stragglers' rounds have settled: injected, then left to page. A hang
    is the job's that its node runs then, as Prometheus saw it, on a job no other fault of the round touches."""
    if not sweep.kinds:
        return []
    seconds = sweep.kinds_minutes * 60 / sweep.time_scale
    names = [f"gpu-node-{number:04d}" for number in range(1, nodes + 1)]
    round_ = incidents.inject(sim_url, names, sweep.kinds, seconds, sweep.seed, time.monotonic(),
                              [job["nodes"] for job in jobs])
    for fault in round_:
        if said := incidents.hang_at_stake(prom_url, fault):
            print(said, file=sys.stderr)
    print("fault kinds: " + ", ".join(f"{f.kind} on {f.node}" for f in round_), file=sys.stderr)
    time.sleep(seconds)
    return round_
