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
import json
import os
import tempfile
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path

import yaml
from rules_bench import ROOT, SCRAPE_SECONDS, self_metrics, start_prometheus
from support import get, start_simulator, stop

from gpufleet.duration import parse as parse_duration

RUNS = 3


def allocated(url: str) -> float:
    value = self_metrics(url).get(("go_memstats_alloc_bytes_total", ""))
    if value is None:
        raise SystemExit("Prometheus did not export go_memstats_alloc_bytes_total")
    return value


def record_history(workdir: Path, nodes: int, rules: Path, warm_up: float) -> None:
    """Scrape and evaluate for `warm_up`, then stop, leaving the storage in `workdir`/data."""
    targets = workdir / "targets.json"
    simulator = start_simulator(nodes, targets, SCRAPE_SECONDS)
    try:
        process, _ = start_prometheus(workdir, targets, rules)
        print(f"recording {warm_up:g} s of history", flush=True)
        time.sleep(warm_up)
        stop(process)
    finally:
        stop(simulator)


def reading_cost(url: str) -> float:
    """What reading the counter allocates, the least of five pairs of reads."""
    costs = []
    for _ in range(5):
        first = allocated(url)
        costs.append(allocated(url) - first)
    return min(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--warm-up", type=parse_duration, default=parse_duration("15m"), help="default 15m")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts" / "gpufleet-rules.yml")
    args = parser.parse_args()
    groups = yaml.safe_load(args.rules.read_text())["groups"]

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        record_history(workdir, args.nodes, args.rules, args.warm_up)
        nothing = workdir / "no-targets.json"
        nothing.write_text("[]\n")
        # The same storage, no target and no rule; replaying a 1,000-node head takes minutes.
        process, url = start_prometheus(workdir, nothing, None, ready_seconds=600)
        try:
            at = json.loads(get(f"{url}/api/v1/query?query={urllib.parse.quote('max(timestamp(up))')}"))
            when = float(at["data"]["result"][0]["value"][1])
            reading = reading_cost(url)
            totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            print(f"\n{args.nodes} nodes; each rule asked alone, best of {RUNS}, on a Prometheus that does "
                  f"nothing else ({os.cpu_count()} CPUs)\n\n{'time':>9} {'allocated':>10}  group / rule")
            for group in groups:
                for rule in group["rules"]:
                    times, allocs = [], []
                    for _ in range(RUNS):
                        before, t0 = allocated(url), time.monotonic()
                        get(f"{url}/api/v1/query?time={when}&query={urllib.parse.quote(rule['expr'])}", 120)
                        times.append(time.monotonic() - t0)
                        allocs.append(allocated(url) - before - reading)
                    totals[group["name"]][0] += min(times)
                    totals[group["name"]][1] += min(allocs)
                    print(f"{min(times) * 1000:6.1f} ms {min(allocs) / 2**20:6.1f} MiB  "
                          f"{group['name']} / {rule.get('record') or rule['alert']}", flush=True)
        finally:
            stop(process)

    print(f"\n{'group':<28} {'interval':>8} {'one evaluation':>16} {'a minute':>18}")
    minute_seconds = minute_bytes = 0.0
    for group in groups:
        interval = group.get("interval", f"{SCRAPE_SECONDS}s")
        seconds, allocs = totals[group["name"]]
        per_minute = 60 / parse_duration(interval)
        minute_seconds += seconds * per_minute
        minute_bytes += allocs * per_minute
        print(f"{group['name']:<28} {interval:>8} {seconds:6.2f} s {allocs / 2**20:5.0f} MiB "
              f"{seconds * per_minute:6.2f} s {allocs * per_minute / 2**20:6.0f} MiB")
    print(f"{'all':<28} {'':>8} {'':>16} {minute_seconds:6.2f} s {minute_bytes / 2**20:6.0f} MiB  "
          f"({minute_seconds / 60:.1%} of a core)")

if __name__ == "__main__":
    main()
