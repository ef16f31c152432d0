"""What each rule costs on its own: time and allocated memory at 1,000 nodes, in Debian's Prometheus, quiet.

Usage: .venv/bin/python bench/rule_costs.py [--nodes 1000] [--warm-up 15m] [--rules alerts/gpufleet-rules.yml]

`rules_bench.py` measures the rules as they run together, where a group's time follows whatever else holds
the CPUs. This one asks where the work is: it starts the simulator and a Prometheus that scrapes it and
evaluates the rules (so that the recorded series the rules read exist), warms up, stops both, starts
Prometheus again on the same storage with nothing to scrape or evaluate, and asks each rule's expression
at the last scrape's time, three times. It prints, per rule, the best of the three for the time of the
query and for the memory Prometheus allocated answering it (`go_memstats_alloc_bytes_total`, less what
reading that counter allocates), which is garbage its collector must clear; then per group, the same
summed over one evaluation and over a minute at the group's interval.

Everything listens on 127.0.0.1; every loop is bounded by count and time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devtools import results
from gpufleet.devtools.net import get
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.programs import prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import own_metrics, query_value
from gpufleet.devtools.waiting import HarnessError
from gpufleet.duration import parse as parse_duration

RUNS = 3
SCRAPE_SECONDS = 15


def allocated(url: str) -> float:
    value = own_metrics(url).get(("go_memstats_alloc_bytes_total", ""))
    if value is None:
        raise HarnessError("Prometheus did not export go_memstats_alloc_bytes_total")
    return value


def config(workdir: Path, targets: Path, rules: Path | None) -> Path:
    return prometheus_config(workdir / "prometheus.yml", targets, f"{SCRAPE_SECONDS}s", rules, scrape_timeout="10s")


def record_history(workdir: Path, nodes: int, rules: Path, warm_up: float) -> None:
    """Scrape and evaluate for `warm_up`, then stop, leaving the storage in `workdir`/data."""
    targets = workdir / "targets.json"
    with (simulator(targets, f"--nodes={nodes}", f"--collect-interval={SCRAPE_SECONDS}s", "--log.level=warn",
                    timeout=300, output="inherit"),
          prometheus(config(workdir, targets, rules), workdir / "data", output="inherit")):
        print(f"recording {warm_up:g} s of history", flush=True)
        time.sleep(warm_up)


def reading_cost(url: str) -> float:
    """What reading the counter allocates, the least of five pairs of reads."""
    costs = []
    for _ in range(5):
        first = allocated(url)
        costs.append(allocated(url) - first)
    return min(costs)


def rule_costs(url: str, groups: list[dict[str, Any]]) -> results.Table:
    """Each rule asked alone at the last scrape's time: the best of RUNS for its time and what it allocated."""
    when = query_value(url, "max(timestamp(up))")
    reading = reading_cost(url)
    table = results.Table(["group", "rule", "time (ms)", "allocated (MiB)"])
    print(f"{'time':>9} {'allocated':>10}  group / rule")
    for group in groups:
        for rule in group["rules"]:
            times, allocs = [], []
            for _ in range(RUNS):
                before, t0 = allocated(url), time.monotonic()
                get(f"{url}/api/v1/query?time={when}&query={urllib.parse.quote(rule['expr'])}", 120)
                times.append(time.monotonic() - t0)
                allocs.append(allocated(url) - before - reading)
            name = rule.get("record") or rule["alert"]
            table.add(group["name"], name, round(min(times) * 1000, 3), round(min(allocs) / 2**20, 3))
            print(f"{min(times) * 1000:6.1f} ms {min(allocs) / 2**20:6.1f} MiB  {group['name']} / {name}", flush=True)
    return table


def per_group(groups: list[dict[str, Any]], rules: results.Table) -> results.Table:
    """Per group, the rules' costs summed over one evaluation and over a minute at the group's interval."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, _, ms, mib in rules.rows:
        totals[str(name)][0] += float(ms or 0) / 1000
        totals[str(name)][1] += float(mib or 0)
    table = results.Table(["group", "interval", "one evaluation (s)", "one evaluation (MiB)", "a minute (s)",
                           "a minute (MiB)"])
    for group in groups:
        interval = group.get("interval", f"{SCRAPE_SECONDS}s")
        seconds, mib = totals[group["name"]]
        per_minute = 60 / parse_duration(interval)
        table.add(group["name"], interval, round(seconds, 3), round(mib), round(seconds * per_minute, 3),
                  round(mib * per_minute))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--warm-up", type=parse_duration, default=parse_duration("15m"), help="default 15m")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts" / "gpufleet-rules.yml")
    results.add_argument(parser)
    args = parser.parse_args()
    groups = yaml.safe_load(args.rules.read_text())["groups"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        record_history(workdir, args.nodes, args.rules, args.warm_up)
        nothing = workdir / "no-targets.json"
        nothing.write_text("[]\n")
        print(f"\n{args.nodes} nodes; each rule asked alone, best of {RUNS}, on a Prometheus that does "
              f"nothing else ({os.cpu_count()} CPUs)\n")
        # The same storage, no target and no rule; replaying a 1,000-node head takes minutes.
        with prometheus(config(workdir, nothing, None), workdir / "data", timeout=600, output="inherit") as server:
            rules = rule_costs(server.url, groups)
    groups_table = per_group(groups, rules)
    print(f"\n{'group':<28} {'interval':>8} {'one evaluation':>16} {'a minute':>18}")
    for name, interval, seconds, mib, minute_seconds, minute_mib in groups_table.rows:
        print(f"{name:<28} {interval:>8} {seconds:6.2f} s {mib:5.0f} MiB {minute_seconds:6.2f} s {minute_mib:6.0f} MiB")
    minute = sum(float(row[4] or 0) for row in groups_table.rows)
    minute_mib = sum(float(row[5] or 0) for row in groups_table.rows)
    print(f"{'all':<28} {'':>8} {'':>16} {minute:6.2f} s {minute_mib:6.0f} MiB  ({minute / 60:.1%} of a core)")
    results.record("rule_costs", {"rule seconds a minute": round(minute, 2), "share of a core": round(minute / 60, 4),
                                  "allocated a minute (MiB)": minute_mib},
                   {"per group": groups_table, "per rule": rules}, path=args.results)


if __name__ == "__main__":
    main()
