"""How small a straggler the rules find, how soon, how often they are wrong, and what a healthy fleet costs.

    python bench/detection_bench.py                 # every cause at 5, 7.5 and 10 %, once per job size
    python bench/detection_bench.py --short         # what CI runs: two stragglers, one round
    python bench/detection_bench.py --healthy-hours 4.25 --jobs 4,4,8,8,16,32,4,4,8,8,16,16   # 523 node-hours
    python bench/detection_bench.py --healthy-hours 4.25 --jobs 4,4,8,8,16,32,4,4,8,8,16,16 --scheduler mixed

The sweep itself is `gpufleet.devtools.detection` (CI runs its short form in `tests/test_detection_bench.py`).
`--cases` names (cause, slowdown) pairs instead of crossing `--causes` with `--slowdowns`. `--healthy-hours`
runs no straggler: the fleet runs healthy for that long while jobs end and new ones take most of their nodes
(`--job-lifetime`), exporters restart (`--restarts-per-node-day`, each refusing scrapes for 20 production
seconds), and a share of scrapes fails (`--missed-scrapes`). `--keep DIR` keeps the run's rules, layout and
Prometheus data, and each false alert is printed with the production minutes it fired in, so that what it saw
can be queried afterwards from a Prometheus started on DIR/data.

Figures are in production minutes: wall seconds times the time scale. Per cause, slowdown and job size:
recall (a `NodeStraggler` on the straggler's node while its fault lasts), the cause named (the alert's
description lists it; `clock` expects none), time to detect (from the fault's start to the first firing)
and to resolve (from its end to the last firing seen). Precision: of every alert that fired, the share a
fault explains: `NodeStraggler` on the straggler's node, or the alert of its own cause on it (thermal
margin, hardware slowdown, InfiniBand congestion, a degraded PCIe link). Every other alert is false, and
is counted against the node-hours of nodes that had no fault at the time. Two nodes have an InfiniBand port
never cabled (`--uncabled`), every node a storage HCA of another model at half the training HCAs' rate, and
one node has a GPU taken out on purpose (`--removals`) during a short reboot: none of these may page.

After the stragglers, a round of the end-to-end fault kinds (`--kinds`, each on a node of its own for
`--kinds-minutes`) counts the pager incidents each fault opens at production timing: PagerDuty dedup keys at
an Alertmanager whose timers are divided like the rules'. A fault that should page opens one, one that
tickets none, and an incident on a node with no fault is a false page. The figures are appended to
bench/results/detection_bench.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from gpufleet.devtools import incidents, results
from gpufleet.devtools.detection import Outcome, Sweep, cases, run, short
from gpufleet.simulator.faults import Cause

_EVERY, _LASTS = Sweep.checkpoint or (0.0, 0.0)
CHECKPOINTS_HELP = ("every job stops to write a synchronous checkpoint about every MINUTES (production), for SECONDS: "
                    "every rank its shard in half the jobs, the first node alone while the others wait in the other "
                    f"half; none for no checkpoints (default: {_EVERY / 60:g}:{_LASTS:g})")


def _checkpoint(text: str) -> tuple[float, float] | None:
    """`--checkpoints MINUTES:SECONDS` as production seconds between checkpoints and of each; `none`: None."""
    if text == "none":
        return None
    every, _, lasts = text.partition(":")
    try:
        return float(every) * 60, float(lasts)
    except ValueError:
        raise SystemExit(f"--checkpoints {text!r}: expected production minutes between checkpoints and seconds "
                         "each lasts, as 30:60, or none") from None


def sweep_from(args: argparse.Namespace) -> Sweep:
    if args.keep is not None and args.keep.exists():
        raise SystemExit(f"--keep {args.keep}: already there; name a new directory")
    sizes = [int(size) for size in args.jobs.split(",")]
    moving = {"seed": args.seed, "time_scale": args.time_scale, "interval": args.interval,
              "restarts_per_node_day": args.restarts_per_node_day, "missed_scrapes": args.missed_scrapes,
              "uncabled": args.uncabled, "removals": args.removals, "scheduler": args.scheduler, "keep": args.keep}
    if args.checkpoints is not None:
        moving["checkpoint"] = _checkpoint(args.checkpoints)
    if args.short:
        return dataclasses.replace(short(), **moving)
    if args.healthy_hours:
        return Sweep(sizes, {}, healthy_minutes=args.healthy_hours * 60, job_lifetime=args.job_lifetime, **moving)
    if args.cases:
        pairs = [(Cause(cause), float(slowdown)) for cause, slowdown in
                 (item.split(":") for item in args.cases.split(","))]
    else:
        pairs = [(Cause(cause), float(slowdown)) for cause in args.causes.split(",")
                 for slowdown in args.slowdowns.split(",")]
    return Sweep(sizes, cases(pairs, sizes, args.seeds), fault_minutes=args.fault_minutes,
                 settle_minutes=args.settle_minutes, healthy_minutes=args.healthy_minutes, kinds=args.kinds,
                 kinds_minutes=args.kinds_minutes, **moving)


def figures(outcome: Outcome, seed: int, wall_minutes: float) -> tuple[dict[str, results.Value],
                                                                      dict[str, results.Table]]:
    found = [c for c in outcome.cases if c.detected is not None]
    detected = [c.detected for c in found if c.detected is not None]
    tally = outcome.tally
    single: dict[str, results.Value] = {
        "stragglers": len(outcome.cases), "found": len(found),
        "cause named": sum(c.named for c in found),
        "detect p50 (production min)": statistics.median(detected) if detected else None,
        "detect max (production min)": max(detected, default=None),
        "alerts": tally.alerts, "explained": tally.explained,
        "precision": tally.explained / tally.alerts if tally.alerts else 1.0,
        "false alerts": len(tally.false), "healthy node-hours": round(outcome.healthy_node_hours, 1),
        "false alerts per 1,000 healthy node-hours": round(1000 * len(tally.false) / outcome.healthy_node_hours, 2)
        if outcome.healthy_node_hours else None,
        "seed": seed, "wall minutes": round(wall_minutes, 1),
        "fault kinds": len(outcome.round), "fault kinds as they should page": sum(f.right for f in outcome.round),
        "most incidents for one fault": max((f.incidents for f in outcome.round), default=None),
        "false pages": len(outcome.false_pages),
        "time to page max (production min)": max((f.paged for f in outcome.round if f.paged is not None),
                                                 default=None)}
    table = results.Table(["cause", "slowdown", "job size", "found", "named", "detect p50 (min)", "resolve max (min)"])
    groups: dict[tuple[str, float, int], list] = {}
    for case in outcome.cases:
        groups.setdefault((case.cause, case.slowdown, case.job_size), []).append(case)
    for (cause, slowdown, size), group in sorted(groups.items()):
        hits = [c for c in group if c.detected is not None]
        table.add(str(cause), slowdown, size, f"{len(hits)}/{len(group)}", sum(c.named for c in hits),
                  statistics.median(c.detected for c in hits) if hits else None,
                  max((c.resolved for c in hits if c.resolved is not None), default=None))
    kinds = results.Table(["kind", "should page", "incidents", "time to page (min)"])
    for fault in outcome.round:
        kinds.add(fault.kind, fault.pages, fault.incidents, fault.paged)
    return single, {"per cause, slowdown and job size": table, "pager incidents per fault kind": kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="4,4,8,8,16,32", help="sizes of the fleet's jobs (default: %(default)s)")
    parser.add_argument("--scheduler", choices=("slurm", "kubernetes", "mixed"), default="slurm",
                        help="the jobs' scheduler: kubernetes jobs have no job id, and their nodes are compared by "
                             "GPU model across jobs; mixed alternates the two (default: %(default)s)")
    parser.add_argument("--causes", default=",".join(Cause), help="straggler causes (default: all)")
    parser.add_argument("--slowdowns", default="0.05,0.075,0.1", help="slowdowns (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=1, help="times each case runs in each job size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=Sweep.time_scale)
    parser.add_argument("--fault-minutes", type=float, default=12.0, help="production minutes each fault lasts")
    parser.add_argument("--settle-minutes", type=float, default=8.0, help="production minutes between rounds")
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
    parser.add_argument("--kinds", type=int, default=len(incidents.KINDS),
                        help="fault kinds in the round after the stragglers, 0 for none (default: all "
                             f"{len(incidents.KINDS)}; none with --healthy-hours)")
    parser.add_argument("--kinds-minutes", type=float, default=20.0,
                        help="production minutes the round of fault kinds lasts (default: %(default)s)")
    parser.add_argument("--uncabled", type=int, default=2,
                        help="nodes with an InfiniBand port never cabled, which must page nobody "
                             "(default: %(default)s)")
    parser.add_argument("--removals", type=int, default=1,
                        help="nodes with a GPU taken out on purpose, halfway through the healthy start "
                             "(default: %(default)s)")
    parser.add_argument("--checkpoints", metavar="MINUTES:SECONDS", help=CHECKPOINTS_HELP)
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep the run's rules, layout and Prometheus data in DIR (new) to query afterwards")
    parser.add_argument("--short", action="store_true",
                        help="CI's version: jobs of 4 and 8, one 20%% clock and one 20%% NIC straggler, one round")
    results.add_argument(parser)
    args = parser.parse_args()
    began = time.monotonic()
    outcome = run(sweep_from(args))
    wall_minutes = (time.monotonic() - began) / 60
    print(outcome.table())
    print(f"Notifications delivered by Alertmanager: {outcome.delivered}")
    print(outcome.movement)
    single, tables = figures(outcome, args.seed, wall_minutes)
    print(f"Seed {args.seed}; {wall_minutes:.1f} wall minutes.")
    results.record("detection_bench", single, tables, notes=outcome.movement, path=args.results)
    if args.short:
        right = all(f.right for f in outcome.round) and not outcome.false_pages
        print(f"found and named: {outcome.found_and_named}; false alerts: {len(outcome.tally.false)}; "
              f"fault kinds paged as they should: {right}")
        if not (outcome.found_and_named and not outcome.tally.false and right):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
