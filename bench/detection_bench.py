"""How small a straggler the rules find, how soon, how often they are wrong, and what a healthy fleet costs.

    python bench/detection_bench.py                 # every cause at 5, 10, 15 and 20 %, once per job size
    python bench/detection_bench.py --short         # what CI runs: two stragglers, one round
    python bench/detection_bench.py --healthy-hours 4.25 --jobs 4,4,8,8,16,32,4,4,8,8,16,16   # 523 node-hours

Real programs: the fleet simulator, Prometheus with the rules generated at `--time-scale` (every window
and `for` divided by it, thresholds unchanged) and Alertmanager with the production routing, delivering
to a receiver here. The fleet runs Slurm jobs of the sizes `--jobs` lists, with training steps of 34 to
54 production seconds. Each round injects one straggler into every job, each a (cause, slowdown) case
drawn for the job's size, on a node drawn from the seed; the faults last `--fault-minutes`, then the
round waits `--settle-minutes` for the alerts to resolve. Before the first round the fleet runs healthy
for `--healthy-minutes`. `--cases` names (cause, slowdown) pairs instead of crossing `--causes` with
`--slowdowns`.

`--healthy-hours` runs no straggler: the fleet runs healthy for that long while it moves as a real one
does. Jobs end and new ones take most of their nodes (`--job-lifetime`), exporters restart
(`--restarts-per-node-day`, each refusing scrapes for 20 production seconds), and a share of scrapes
fails (`--missed-scrapes`). Every alert that fires is false. The first 10 production minutes, while
the signal windows fill, are neither judged nor counted as healthy node-hours.

Figures are in production minutes: wall seconds times the time scale. Per cause, slowdown and job size:
recall (a `NodeStraggler` on the straggler's node while its fault lasts), the cause named (the alert's
description lists it; `clock` expects none), time to detect (from the fault's start to the first firing)
and to resolve (from its end to the last firing seen). Precision: of every alert that fired, the share a
fault explains: `NodeStraggler` on the straggler's node, or the alert of its own cause on it (thermal
margin, hardware slowdown, InfiniBand congestion, a degraded PCIe link). Every other alert is false, and
is counted against the node-hours of nodes that had no fault at the time.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # The real programs, started as the end-to-end test starts them.

import yaml  # noqa: E402

from gpufleet.alerts.config import Config  # noqa: E402
from gpufleet.alerts.rules import render  # noqa: E402
from gpufleet.simulator.faults import Cause  # noqa: E402

from delivery import AlertLog, Receiver, routing  # noqa: E402
from programs import alertmanager, http, prometheus, prometheus_config, query, simulator  # noqa: E402

# What names each cause in the alert's description, and the alert of the cause itself, on the same node.
NAMED = {Cause.CLOCK: "none of", Cause.THERMAL: "thermal slowdown", Cause.POWER: "power brake",
         Cause.NIC: "NIC congestion", Cause.PCIE: "PCIe degraded", Cause.HOST: "GPUs idle between steps"}
OWN_ALERTS = {Cause.THERMAL: {"GpuThermalMarginLow"}, Cause.POWER: {"GpuHardwareSlowdown"},
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


def layout(sizes: list[int], seed: int) -> tuple[int, list[dict[str, Any]]]:
    rng = random.Random(f"layout:{seed}")
    jobs, first = [], 1
    for number, size in enumerate(sizes):
        nodes = [f"gpu-node-{i:04d}" for i in range(first, first + size)]
        first += size
        jobs.append({"id": str(700000 + number), "scheduler": "slurm", "nodes": nodes,
                     "period": round(rng.uniform(4.3, 6.7), 2), "comm_fraction": round(rng.uniform(0.2, 0.35), 2)})
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
        raise SystemExit(f"the simulator refused a fault: {status} {body!r}")


def explains(labels: dict[str, str], first: float, last: float, done: list[Case], scale: float) -> bool:
    """Whether a fault explains an alert episode: one on the alert's node that overlaps it, allowing the
    alert to resolve up to two signal windows (10 production minutes) after the fault's end."""
    grace = 600 / scale
    for case in done:
        if case.node != labels.get("instance") or not (case.start <= last and first <= case.end + grace):
            continue
        if labels.get("alertname") == "NodeStraggler" or labels.get("alertname") in OWN_ALERTS.get(case.cause, ()):
            return True
    return False


def judge(log: AlertLog, done: list[Case], scale: float, since: float) -> Tally:
    tally = Tally()
    for key, spells in log.episodes.items():
        labels = dict(key)
        for first, last in spells:
            if last < since:
                continue
            tally.alerts += 1
            if explains(labels, first, last, done, scale):
                tally.explained += 1
            else:
                tally.false.append(f"{labels.get('alertname')} on {labels.get('instance')} "
                                   f"{ {k: v for k, v in labels.items() if k not in ('alertname', 'instance')} }")
    for case in done:
        straggling = [(key, spell) for key, spells in log.episodes.items() for spell in spells
                      if dict(key).get("alertname") == "NodeStraggler" and dict(key).get("instance") == case.node
                      and case.start <= spell[0] <= case.end]
        if straggling:
            first_spell = min(spell for _, spell in straggling)
            case.detected = (first_spell[0] - case.start) * scale / 60
            case.resolved = (max(spell[1] for _, spell in straggling) - case.end) * scale / 60
            case.named = any(NAMED[case.cause] in log.annotations.get(key, {}).get("description", "")
                             for key, _ in straggling)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="4,4,8,8,16,32", help="sizes of the fleet's jobs (default: %(default)s)")
    parser.add_argument("--causes", default=",".join(Cause), help="straggler causes (default: all)")
    parser.add_argument("--slowdowns", default="0.05,0.1,0.15,0.2", help="slowdowns (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=1, help="times each case runs in each job size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=8.0)
    parser.add_argument("--fault-minutes", type=float, default=22.0, help="production minutes each fault lasts")
    parser.add_argument("--settle-minutes", type=float, default=12.0, help="production minutes between rounds")
    parser.add_argument("--healthy-minutes", type=float, default=60.0, help="production minutes before round 1")
    parser.add_argument("--interval", default="2s", help="collection and scrape interval, wall time")
    parser.add_argument("--cases", help="cause:slowdown pairs, instead of --causes crossed with --slowdowns")
    parser.add_argument("--healthy-hours", type=float, default=0.0,
                        help="no stragglers: production hours of a healthy fleet with churn, restarts and missed "
                             "scrapes")
    parser.add_argument("--job-lifetime", type=float, default=60.0,
                        help="with --healthy-hours: production minutes a job lasts on average")
    parser.add_argument("--restarts-per-node-day", type=float, default=6.0,
                        help="exporter restarts per node and production day (default: %(default)s)")
    parser.add_argument("--missed-scrapes", type=float, default=0.005,
                        help="share of scrapes that fail (default: %(default)s)")
    parser.add_argument("--short", action="store_true",
                        help="CI's version: jobs of 4 and 8, one 20%% clock and one 20%% NIC straggler, one round")
    args = parser.parse_args()
    scale = args.time_scale
    if args.short:  # One round: the job of 4 gets the clock straggler, the job of 8 the NIC one.
        sizes = [4, 8]
        queues = {4: [Case(Cause.CLOCK, 0.2, 4)], 8: [Case(Cause.NIC, 0.2, 8)]}
        args.healthy_minutes, args.fault_minutes, args.settle_minutes = 12.0, 18.0, 11.0
    elif args.healthy_hours:
        sizes, queues = [int(size) for size in args.jobs.split(",")], {}
        args.healthy_minutes = args.healthy_hours * 60
    else:
        sizes = [int(size) for size in args.jobs.split(",")]
        if args.cases:
            pairs = [(Cause(cause), float(slowdown)) for cause, slowdown in
                     (item.split(":") for item in args.cases.split(","))]
        else:
            pairs = [(Cause(cause), float(slowdown)) for cause in args.causes.split(",")
                     for slowdown in args.slowdowns.split(",")]
        queues = cases(pairs, sizes, args.seeds)
    count, jobs = layout(sizes, args.seed)
    config = Config().scaled(scale)
    done: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="detection-bench-") as tmp:
        work = Path(tmp)
        (work / "rules.yml").write_text(render(config))
        (work / "layout.yml").write_text(yaml.safe_dump({"jobs": jobs}))
        (work / "am").mkdir()
        restart_rates(work / "restarts.yml", args.restarts_per_node_day, scale)
        rounds_count = max((len(queue) for queue in queues.values()), default=0)
        horizon = (args.healthy_minutes + rounds_count * (args.fault_minutes + args.settle_minutes)) * 60 / scale
        moving = [f"--fault-rates={work / 'restarts.yml'}", f"--fault-rates.horizon={round(horizon) + 60}s",
                  f"--missed-scrapes={args.missed_scrapes}"]
        if args.healthy_hours:
            moving.append(f"--job-lifetime={round(args.job_lifetime * 60 / scale)}s")
        receiver = Receiver()
        with simulator(work, f"--nodes={count}", f"--seed={args.seed}", f"--layout={work / 'layout.yml'}",
                       "--cluster=bench", f"--collect-interval={args.interval}", *moving) as (sim_url, targets), \
                alertmanager(routing(work, receiver), work / "am") as am_url, \
                prometheus(prometheus_config(work / "prometheus.yml", targets, args.interval, work / "rules.yml",
                                             am_url), work / "data") as prom_url:
            log = AlertLog(prom_url)
            began = time.monotonic()
            # The first signal window fills while nodes are first scraped: alerts from then are not judged.
            since = began + 600 / scale
            print(f"{count} nodes in jobs of {sizes}; healthy for {args.healthy_minutes:g} production minutes",
                  file=sys.stderr)
            time.sleep(args.healthy_minutes * 60 / scale)
            for number, batch in enumerate(rounds(jobs, queues, args.seed), 1):
                seconds = args.fault_minutes * 60 / scale
                for case in batch:
                    case.start = time.monotonic()
                    post(sim_url, case, seconds)
                    case.end = case.start + seconds
                    done.append(case)
                print(f"round {number}: " + ", ".join(f"{c.cause} {c.slowdown:.0%} on {c.node} (job of "
                                                      f"{c.job_size})" for c in batch), file=sys.stderr)
                time.sleep(seconds + args.settle_minutes * 60 / scale)
            log.stop()
            ended = time.monotonic()
            moved = movement(sim_url, prom_url, round(ended - began))
        delivered = len(receiver.snapshot())
    tally = judge(log, done, scale, since)
    faulted = sum(min(c.end + 600 / scale, ended) - c.start for c in done)
    healthy_node_hours = (count * (ended - since) - faulted) * scale / 3600
    print(report(done, tally, healthy_node_hours, config))
    print(f"Notifications delivered by Alertmanager: {delivered}")
    print(moved)
    if args.short:
        found = all(c.detected is not None and c.named for c in done)
        print(json.dumps({"found_and_named": found, "false_alerts": len(tally.false)}))
        sys.exit(0 if found and not tally.false else 1)


if __name__ == "__main__":
    main()
