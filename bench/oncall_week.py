"""An on-call week of a 2,000-GPU fleet: real faults and the week's planned work, and what reached the pager.

    python bench/oncall_week.py            # 250 nodes of 8 GPUs, 3 production hours at time scale 2.5 (72 min)
    python bench/oncall_week.py --short    # what CI runs: 16 nodes, 45 production minutes at time scale 16

The week itself is `gpufleet.devtools.oncall`, judged by `gpufleet.devtools.oncall_judge`: the simulator, Slurm,
`gpufleet remediate` (dry run, for Slurm's view), Prometheus and Alertmanager with the production rules and routing,
their timers divided by the time scale. Faults: every kind of the simulator's end-to-end round once, each on a node
of its own, and the faults seven days of the fleet draw from the Llama 3 profile (simulator/fault-rates/llama3.yml,
its GSP timeouts as hung drivers), moved into the timeline. Planned work, done as docs/alerts/maintenance.md says:
every exporter restarted, a rolling driver upgrade of a tenth of the fleet, an RMA that keeps a node off for 1.5
production hours, a Prometheus restart, a leaf switch's firmware, a GPU removed, a GPU that does not survive a
node's maintenance (it must page once the node returns, and not before), and a maintenance reservation that its
drain outlives (its ticket, an hour after the stated end).

It prints each fault with its incidents, tickets and time to page (production minutes from its start, or from its
node's return), pages caused by planned work, pages resolved while their fault held, faults that reached no
receiver, pages per 12-hour shift, and tickets; the figures go to bench/results/oncall_week.json. It exits 1 when a
target of the week is missed (no page from planned work, at most one incident per fault, none resolved while its
fault held, every fault that should page paged, and within its allowed time).
"""

from __future__ import annotations

import argparse
import dataclasses

from gpufleet.devtools import oncall, oncall_judge, oncall_run, results


def week_from(args: argparse.Namespace) -> oncall.Week:
    week = oncall.short() if args.short else oncall.Week()
    changes = {name: value for name, value in (("nodes", args.nodes), ("seed", args.seed),
                                                ("time_scale", args.time_scale), ("interval", args.interval))
               if value is not None}
    week = dataclasses.replace(week, **changes)
    jobs: list[int] = []
    for size in week.jobs:  # The jobs that fit in the fleet, leaving a sixth of it idle at least.
        if sum(jobs) + size <= 0.85 * week.nodes:
            jobs.append(size)
    return dataclasses.replace(week, jobs=tuple(jobs))


def missed(figures: dict[str, float | int | None]) -> list[str]:
    targets = {"pages caused by planned work": 0, "other false pages": 0, "pages resolved while their fault held": 0,
               "faults that reached no receiver": 0, "faults that should page and did not": 0,
               "faults that paged and should not": 0, "faults paged later than allowed": 0}
    missed_ = [f"{name}: {figures[name]}, target {limit}" for name, limit in targets.items()
               if (figures[name] or 0) > limit]
    if (figures["most incidents for one fault"] or 0) > 1:
        missed_.append(f"most incidents for one fault: {figures['most incidents for one fault']}, target 1")
    return missed_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI's week (oncall.short)")
    parser.add_argument("--nodes", type=int, help="nodes of 8 GPUs (default: 250, or 16 with --short)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--time-scale", type=float,
                        help="production seconds per wall second (default: 2.5, or 16 with --short)")
    parser.add_argument("--interval",
                        help="collection and scrape interval, wall time (default: 6s, or 1s with --short)")
    results.add_argument(parser)
    args = parser.parse_args()
    week = week_from(args)
    the_plan, running, receiver, ended = oncall_run.run(week)
    judged = oncall_judge.judge(the_plan.faults, the_plan.works, running, receiver, ended)
    print(oncall_judge.report(judged, running))
    print("\n".join(f"  log: {line}" for line in running.log if line))
    figures = oncall_judge.figures(judged, week)
    health = running.health
    figures.update({"slowest rule group evaluation (share of its interval)": round(health.worst_evaluation, 3),
                    "rule group evaluations skipped": health.missed_evaluations,
                    "node scrapes failed (share)": round(health.failed_scrapes, 4)})
    table = results.Table(["fault", "node", "cause", "expected", "incidents", "tickets", "time to page (min)",
                           "allowed (min)"])
    for verdict in judged.verdicts:
        table.add(oncall_judge.label(verdict.fault), verdict.fault.injected.node, verdict.fault.cause,
                  verdict.fault.expect, len(verdict.incidents), verdict.tickets, verdict.paged, verdict.allowed)
    spans = (f"Spans run in full at time scale {week.time_scale:g}: the RMA's {week.times.rma_minutes:g} production "
             "minutes powered off (the pager's repeat_interval is 60), a maintenance reservation's stated end and "
             "the hour after it that NodeMaintenanceOverdue waits, the profile's faults up to their length or the end "
             f"of the run. The timeline is {week.times.hours:g} production hours, so the rest of the week's quiet "
             "time is cut, and so are GpuCountDropped's day and NodesUnscraped's days, which promtool runs in full "
             "instead (alerts/tests/gpu-failures.test.yml, unscraped.test.yml).")
    print(spans)
    results.record("oncall_week", figures, {"faults": table}, notes=spans, path=args.results)
    failures = missed(figures)
    for failure in failures:
        print(f"missed: {failure}")
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
