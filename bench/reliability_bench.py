"""Benchmark of `gpufleet report reliability` over a simulated month of 2,048 GPUs failing at Llama 3's rates.

Usage: .venv/bin/python bench/reliability_bench.py [--nodes 256] [--days 30] [--scale 1] [--seed 1] [--hold 6h]

The month the CI test draws for 16 GPUs at 400 times the profile's rates, drawn here for a fleet the
size of a large pre-training run's slice at the rates themselves: the simulator's nodes (8 GPUs, 8
InfiniBand ports) in jobs of 16 nodes, faults drawn from simulator/fault-rates/llama3.yml, 31 days of
history imported into Debian's Prometheus (127.0.0.1), the reliability and capacity rules recorded over
the last 30 with promtool, then `gpufleet report reliability --range 30d`. It prints, per cause, what the
profile asked for, what the simulator started and what the report found with its 95% interval, and the
time each stage took.

A node whose faults are all quiet repeats its last collected values for up to `--hold` instead of being
collected at every 5-minute step (see simulator/history.py): at every step, this month would be 2.3
million collections, about five hours here. The test in tests/test_fault_rates.py checks that a held
history writes what a collected one does for every family the report reads.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from gpufleet import cli as gpufleet_cli
from gpufleet.alerts import reliability as rules
from gpufleet.devtools import results
from gpufleet.devtools.months import STEP, Month, asked_per_gpu_day, jobs, month
from gpufleet.devtools.tables import interval, markdown_tables, rows
from gpufleet.flags import duration
from gpufleet.simulator.fleet import Fleet

JOB_NODES = 16


def _within(cell: str, value: float) -> str:
    low, high = interval(cell)
    return "yes" if low <= value <= high else "NO"


def report(held: Month, days: int, out: Path) -> dict[str, dict[str, str]] | int:
    """The report's rows of interruptions by cause, or its exit code where it failed."""
    began = time.monotonic()
    code = gpufleet_cli.main(["report", "reliability", "--prometheus", held.url, "--range", f"{days}d",
                              "--end", str(held.end), "--out", str(out)])
    print(f"report: {time.monotonic() - began:.1f} s, exit {code}")
    if code != 0:
        return code
    tables = markdown_tables((out / "reliability-report.md").read_text())
    return {row["Cause"]: row for row in rows(tables, "Interruptions by cause")}


def compare(found: dict[str, dict[str, str]], held: Month, scale: float) -> results.Table:
    """Per class, what the profile asked for, what the simulator started and what the report found."""
    asked = asked_per_gpu_day(scale)
    table = results.Table(["cause", "asked per 1,000 GPU-days", "started", "found", "report's rate",
                           "95% interval", "holds asked"])
    for key, title in [*rules.CLASSES.items(), ("all", "All causes")]:
        wanted = 1000 * (sum(asked.values()) if key == "all" else asked[key])
        begun = sum(held.started.values()) if key == "all" else held.started[key]
        row = found[title]
        table.add(title, round(wanted, 3), begun, int(row["Interruptions"]), row["Per 1,000 GPU-days"],
                  row["95% interval"], _within(row["95% interval"], wanted))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256, help="nodes of 8 GPUs (default 256: 2,048 GPUs)")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every rate of the profile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hold", type=duration, default=duration("6h"), help="longest a quiet node's values are held")
    results.add_argument(parser)
    args = parser.parse_args()
    fleet = Fleet(args.nodes, seed=args.seed, layout=jobs(args.nodes, JOB_NODES))
    gpus = args.nodes * fleet.gpus_per_node
    print(f"{args.nodes} nodes, {gpus:,} GPUs, {args.days} days, Llama 3 profile x {args.scale:g}, seed {args.seed}")
    with (tempfile.TemporaryDirectory(prefix="reliability-bench-") as tmp,
          month(Path(tmp), fleet, args.days, args.scale, args.seed, args.hold) as held):
        steps = (args.days + 1) * 86400 // STEP + 1
        collected = held.collections / (steps * args.nodes)
        print(f"history: {held.timings['history']:.0f} s, {held.collections:,} node collections "
              f"({collected:.1%} of every node at every step)")
        print(f"rules recorded over {args.days} days: {held.timings['rules']:.0f} s")
        found = report(held, args.days, Path(tmp) / "report")
    if isinstance(found, int):
        return found
    table = compare(found, held, args.scale)
    print(f"\n{'cause':50} {'asked':>8} {'started':>8} {'found':>6} {'rate':>8}  {'95% interval':>16}  holds asked")
    for title, wanted, begun, count, rate, bounds, holds in table.rows:
        print(f"{title:50} {wanted:8.3f} {begun:8d} {count:>6} {rate:>8}  {bounds:>16}  {holds}")
    print("(rates per 1,000 GPU-days)")
    results.record("reliability_bench", {
        "GPUs": gpus, "days": args.days, "history (s)": round(held.timings["history"]),
        "rules recorded (s)": round(held.timings["rules"]), "node-steps collected": round(collected, 4)},
        {"interruptions by cause": table}, path=args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
