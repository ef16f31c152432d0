"""The scale tier end to end at 10,000 GPUs: simulated nodes, three vmagents, VictoriaMetrics, vmalert.

Usage: .venv/bin/python bench/pipeline_bench.py [--nodes 1250] [--simulators 2] [--warm-up 12m] [--seconds 300]
                                                [--simulator-nice 19]

Runs the compose file's `scale` tier on this machine, each program with the flags compose gives it
(Debian's victoria-metrics 1.79.5 for all three kinds): three vmagents that share the targets with each
target scraped by two of them, scraping the `gpufleet` job of `compose/vmagent/scrape.yml` every 15 s;
one VictoriaMetrics; vmalert evaluating the committed `alerts/gpufleet-vmalert-rules.yml` (as compose
runs it) and notifying an Alertmanager that routes nowhere. The fleet is --nodes nodes of 8 GPUs served
by --simulators `gpufleet simulate` processes (one cannot serve 1,250 nodes on one core), each its own
cluster (sim-0, sim-1, ...), so that node names repeat and series do not.

After --warm-up (12 minutes: more than the rules read back) it measures over --seconds and
prints, per rule group, where in its interval vmalert starts it, every evaluation's duration (p50, p99,
max, and max as a share of the group's interval), missed iterations, its rules' times asked alone once
vmalert has stopped, and when its worst evaluation began (which groups it met); failed rule executions and
the queries that waited for a query slot of VictoriaMetrics; the active series and the samples a second
VictoriaMetrics took in; each program's CPU and peak memory; whether the simulators kept up (the
oldest GPU snapshot scraped); and the ten slowest rules asked alone.
Everything listens on 127.0.0.1; every loop is bounded by count and time.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from gpufleet.alerts.cli import VMALERT_RULES_FILE
from gpufleet.devtools import results
from gpufleet.devtools.compose import AGENTS, compose_flags, victoria_metrics_flags, vmalert_flags
from gpufleet.devtools.net import get
from gpufleet.devtools.paths import COMPOSE_DIR
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import alertmanager, simulator, victoria_metrics, vmagent, vmalert
from gpufleet.devtools.prom import OLDEST_SNAPSHOT, VmalertIterations, own_metric, query_value, rule_times
from gpufleet.devtools.resources import cpu_seconds, peak_rss_mib
from gpufleet.devtools.stats import percentile
from gpufleet.duration import parse as parse_duration

SCRAPE = yaml.safe_load((COMPOSE_DIR / "vmagent" / "scrape.yml").read_text())
SAMPLE_SECONDS = 2.0
SCRAPE_SECONDS = 15  # compose's scrape interval and vmalert's -evaluationInterval.
TIMEOUT = 60.0


def group_starts(vmalert_url: str, intervals: dict[str, float]) -> dict[str, float]:
    """Each group's last evaluation, as seconds into its interval by the clock. Groups that start close
    together contend for the CPU at every run, and which do depends on where vmalert placed them."""
    starts = {}
    for group in json.loads(get(f"{vmalert_url}/api/v1/rules", TIMEOUT))["data"]["groups"]:
        whole, _, fraction = group.get("lastEvaluation", "0001").rstrip("Z").partition(".")
        if group["name"] in intervals and not whole.startswith("0001"):  # Go's zero time: not evaluated yet.
            seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")
            starts[group["name"]] = seconds % intervals[group["name"]]
    return starts


def worst_at(iterations: VmalertIterations, group: str) -> float:
    """When a group's slowest evaluation began, as seconds into the 5 minutes by the clock: which other groups
    it met follows from their start columns, since every group starts at the same point of each interval."""
    seen = iterations.durations.get(group, [])
    if not seen:
        return float("nan")
    worst = max(range(len(seen)), key=seen.__getitem__)
    return (iterations.ended[group][worst] - seen[worst]) % 300


@dataclass
class Tier:
    """The running programs by name, and the servers the measurement asks."""

    running: dict[str, Server]
    store: str
    evaluator: Server


def start_tier(stack: contextlib.ExitStack, args: argparse.Namespace, workdir: Path) -> Tier:
    """The simulators, VictoriaMetrics, the vmagents, an Alertmanager routing nowhere and vmalert, on `stack`,
    each with compose's flags but for what the bench sets itself."""
    running: dict[str, Server] = {}
    targets = []
    share = [args.nodes // args.simulators + (n < args.nodes % args.simulators) for n in range(args.simulators)]
    for n, nodes in enumerate(share):
        targets.append(workdir / f"sim-{n}.json")
        running[f"simulator {n}"] = stack.enter_context(simulator(
            targets[-1], f"--nodes={nodes}", f"--cluster=sim-{n}", f"--seed={n}", "--log.level=warn", timeout=120,
            niceness=args.simulator_nice, output="discard"))
    job = next(j for j in SCRAPE["scrape_configs"] if j["job_name"] == "gpufleet")
    scrape = workdir / "scrape.yml"
    scrape.write_text(yaml.safe_dump({"global": SCRAPE["global"], "scrape_configs": [
        {**job, "file_sd_configs": [{"files": [str(t) for t in targets]}]}]}))
    vm = running["victoriametrics"] = stack.enter_context(victoria_metrics(
        workdir / "vm", "-loggerLevel=ERROR",
        *victoria_metrics_flags(), *args.victoriametrics_flag,
        timeout=120, output="discard"))
    for name in AGENTS:
        running[name] = stack.enter_context(vmagent(
            scrape, vm.url, workdir / name, "-loggerLevel=ERROR",
            *compose_flags(name, ("-promscrape.config", "-remoteWrite.url", "-remoteWrite.tmpDataPath",
                                  "-httpListenAddr")), *args.vmagent_flag, timeout=120, output="discard"))
    am = running["alertmanager"] = stack.enter_context(alertmanager(workdir / "alertmanager", timeout=120))
    evaluator = running["vmalert"] = stack.enter_context(vmalert(
        VMALERT_RULES_FILE, vm.url, am.url, "-loggerLevel=ERROR", *vmalert_flags(), timeout=120, output="discard"))
    return Tier(running, vm.url, evaluator)


def measure(tier: Tier, seconds: float, intervals: dict[str, float]) -> dict[str, Any]:
    """Every program's CPU and memory, every group's evaluations, and the store's figures, over `seconds`."""
    processes = {name: psutil.Process(server.pid) for name, server in tier.running.items()}
    cpu0 = {name: cpu_seconds(p) for name, p in processes.items()}
    rows0 = own_metric(tier.store, "vm_rows_inserted_total")
    queued0 = own_metric(tier.store, "vm_concurrent_select_limit_reached_total")
    iterations = VmalertIterations(tier.evaluator.url)
    began = time.monotonic()
    for tick in range(int(seconds / SAMPLE_SECONDS)):
        time.sleep(max(0.0, began + (tick + 1) * SAMPLE_SECONDS - time.monotonic()))
        iterations.sample()
    elapsed = time.monotonic() - began
    return {
        "iterations": iterations,
        "cpu": {name: (cpu_seconds(p) - cpu0[name]) / elapsed for name, p in processes.items()},
        "rss": {name: peak_rss_mib(p.pid) for name, p in processes.items()},
        # A count() over every series is refused past -search.maxUniqueTimeseries: ask the store's own cache.
        "series": own_metric(tier.store, "vm_cache_entries", type="storage/hour_metric_ids"),
        "rows": (own_metric(tier.store, "vm_rows_inserted_total") - rows0) / elapsed,
        "queued": own_metric(tier.store, "vm_concurrent_select_limit_reached_total") - queued0,
        "oldest": query_value(tier.store, OLDEST_SNAPSHOT.format(window=f"{int(seconds)}s:{SCRAPE_SECONDS}s"),
                              TIMEOUT),
        "starts": group_starts(tier.evaluator.url, intervals),
    }


def group_table(measured: dict[str, Any], intervals: dict[str, float],
                alone: list[tuple[float, str, str]]) -> results.Table:
    iterations: VmalertIterations = measured["iterations"]
    table = results.Table(["rule group", "interval (s)", "starts (s)", "runs", "p50 (s)", "p99 (s)", "max (s)",
                           "max / interval", "missed", "alone (s)", "worst at (s)"])
    for group, interval in intervals.items():
        seen = iterations.durations.get(group, [])
        worst = max(seen, default=float("nan"))
        table.add(group, interval, measured["starts"].get(group), len(seen), percentile(seen, 0.5),
                  percentile(seen, 0.99), worst, worst / interval,
                  iterations.since_start("vmalert_iteration_missed_total", group),
                  sum(t for t, g, _ in alone if g == group), worst_at(iterations, group))
    return table


def print_figures(table: results.Table, measured: dict[str, Any], alone: list[tuple[float, str, str]]) -> None:
    print(f"\n{'rule group':<24}{'interval':>9}{'starts':>8}{'runs':>6}{'p50 s':>9}{'p99 s':>9}{'max s':>9}"
          f"{'max/int':>9}{'missed':>8}{'alone s':>9}{'worst at':>10}")
    for group, interval, start, runs, p50, p99, worst, share, missed, alone_s, at in table.rows:
        print(f"{group:<24}{interval:>9g}{float('nan') if start is None else start:>8.1f}{runs:>6}{p50:>9.3f}"
              f"{p99:>9.3f}{worst:>9.3f}{share:>9.1%}{missed:>8.0f}{alone_s:>9.3f}{at:>10.0f}")
    print("(starts: seconds into its interval, by the clock, at which vmalert 1.79 evaluates the group; it places "
          "each group by a hash of the rule file's path and the group's name. alone: its rules' times summed, each "
          "asked alone after vmalert stopped. worst at: seconds into the 5 minutes by the clock at which its slowest "
          "evaluation began, within 2 s)")
    iterations: VmalertIterations = measured["iterations"]
    print(f"failed rule executions: {iterations.since_start('vmalert_execution_errors_total'):.0f}; queries that "
          f"waited for one of VictoriaMetrics's query slots: {measured['queued']:.0f}")
    print(f"active series in VictoriaMetrics: {measured['series']:,.0f}; rows taken in: {measured['rows']:,.0f}/s "
          "(every vmagent's copy of each sample, before deduplication)")
    print(f"oldest GPU snapshot scraped: {measured['oldest'] or float('nan'):.1f} s (collection every 15 s)")
    print("\nten slowest rules, each asked alone after vmalert stopped (median of three):")
    for seconds, group, name in alone[:10]:
        print(f"{seconds:>8.3f} s  {group:<24}{name}")
    print(f"\n{'program':<18}{'cores':>8}{'peak RSS MiB':>14}")
    for name, cores in measured["cpu"].items():
        print(f"{name:<18}{cores:>8.2f}{measured['rss'][name]:>14.0f}")
    print(f"{'all':<18}{sum(measured['cpu'].values()):>8.2f}{sum(measured['rss'].values()):>14.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--simulators", type=int, default=2)
    parser.add_argument("--warm-up", type=parse_duration, default=parse_duration("12m"), help="default 12m")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--victoriametrics-flag", action="append", default=[], metavar="FLAG",
                        help="a flag for VictoriaMetrics besides compose's, to try a setting (repeatable)")
    parser.add_argument("--vmagent-flag", action="append", default=[], metavar="FLAG",
                        help="a flag for every vmagent after compose's, which it overrides (repeatable)")
    parser.add_argument("--simulator-nice", type=int, default=0, metavar="N",
                        help="run the simulators at this niceness (1-19), so that the tier has the CPU first")
    results.add_argument(parser)
    args = parser.parse_args()
    rules = yaml.safe_load(VMALERT_RULES_FILE.read_text())
    intervals = {g["name"]: parse_duration(g.get("interval", f"{SCRAPE_SECONDS}s")) for g in rules["groups"]}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        tier = start_tier(stack, args, Path(tmp))
        print(f"{args.nodes} nodes x 8 GPUs from {args.simulators} simulators"
              + (f" at nice {args.simulator_nice}" if args.simulator_nice else "") + "; flags beside compose's: "
              f"VictoriaMetrics {' '.join(args.victoriametrics_flag) or 'none'}, vmagents "
              f"{' '.join(args.vmagent_flag) or 'none'}; warming up for {args.warm_up:g} s", flush=True)
        time.sleep(args.warm_up)
        measured = measure(tier, args.seconds, intervals)
        tier.evaluator.stop()
        alone = rule_times(tier.store, rules, time.time() // SCRAPE_SECONDS * SCRAPE_SECONDS)
    table = group_table(measured, intervals, alone)
    print_figures(table, measured, alone)
    iterations: VmalertIterations = measured["iterations"]
    results.record("pipeline_bench", {
        "nodes": args.nodes, "active series": measured["series"], "rows a second": measured["rows"],
        "queries that waited for a slot": measured["queued"], "oldest GPU snapshot (s)": measured["oldest"],
        "failed rule executions": iterations.since_start("vmalert_execution_errors_total"),
        "worst evaluation / interval": max((float(row[7]) for row in table.rows
                                            if isinstance(row[7], float) and not math.isnan(row[7])), default=None),
        **{f"{name} cores": cores for name, cores in measured["cpu"].items()},
        **{f"{name} peak RSS (MiB)": mib for name, mib in measured["rss"].items()}},
        {"rule groups": table}, path=args.results)


if __name__ == "__main__":
    main()
