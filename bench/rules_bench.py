"""Benchmark of gpufleet's rules on a simulated fleet, in Debian's Prometheus, with and without them.

Usage: .venv/bin/python bench/rules_bench.py [--nodes 1000] [--warm-up 15m] [--seconds 600]
                                             [--rules alerts/gpufleet-rules.yml] [--skip-baseline]
                                             [--gomemlimit 2560MiB] [--simulator-nice 19]

Starts the simulator with N nodes of 8 GPUs, then, one after the other, two Prometheus servers
(127.0.0.1, fresh storage each) that scrape it every 15 s and evaluate every 15 s: the first without
rules, the second with the rule file. Each is warmed up (by default 15 minutes: the longest window
that a group evaluated at the scrape interval reads; the hour- and day-long windows of the trend
groups are not filled in any run this short), then measured over --seconds;
both for the same time, so that their heads are as old and their memory compares.
It prints:

* per rule group: its interval, p50/p99/max of `prometheus_rule_group_last_duration_seconds`
  (sampled every 5 s) and p99 as a share of the interval, missed iterations and failed
  evaluations over the measurement;
* the ten slowest rules, by their longest evaluation seen in `/api/v1/rules`;
* for both servers: head series, series per node, CPU as a share of one core over the
  measurement, and peak resident memory; the rules' cost is the difference;
* whether the simulator kept up: the oldest GPU snapshot Prometheus scraped, and its CPU share;
* with --gomemlimit, both servers run under that soft memory limit of Go's runtime (the `GOMEMLIMIT`
  variable, Go 1.19 and later: Debian's Prometheus 2.42 is built with 1.19), which collects garbage
  more often as the heap nears it, instead of letting the heap grow to twice its live data;
* with --simulator-nice N, the simulator runs at that niceness: Prometheus then has the CPU first, as it
  would on a machine of its own, and what is left of the groups' worst evaluations is Prometheus's own
  contention (its other groups, its scrapes, its garbage collector), not the stand-in fleet's;
* with --profiles DIR, each server's heap profile and a 30 s CPU profile at the end of its measurement,
  saved for `go tool pprof` (Debian's golang-go), to see where the rules' CPU and memory go.
* every dashboard target as Grafana sends it (variables at All or, where a dashboard picks one
  value, the first node; a graph's target over the last hour at a 15 s step, or the panel's minimum
  interval where it sets one, a table's or stat's `instant` target at the end of that hour;
  `$__interval` the step and `$__rate_interval` as Grafana derives them), and every query of
  `gpufleet report capacity --range 1h`, each timed by Prometheus's own query log; the ten slowest
  of each, and their p99.

Everything listens on 127.0.0.1; every loop is bounded by count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpufleet.devtools import grafana, results
from gpufleet.devtools.net import get
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import OLDEST_SNAPSHOT, query_value, rule_group_metrics
from gpufleet.devtools.resources import cpu_seconds, peak_rss_mib
from gpufleet.devtools.stats import percentile
from gpufleet.duration import parse as parse_duration

SCRAPE_SECONDS = 15
SAMPLE_SECONDS = 5
TIMEOUT = 60.0  # Prometheus answers slowly while it evaluates the rules of a 1,000-node fleet.


@dataclass
class GroupFigures:
    interval: float = 0.0
    durations: list[float] = field(default_factory=list)
    missed: float = 0.0
    failures: float = 0.0


@dataclass
class Run:
    name: str
    cpu_share: float
    peak_rss_mib: float
    head_series: float
    series_per_node: float
    oldest_snapshot: float | None
    simulator_cpu_share: float
    groups: dict[str, GroupFigures]
    rules: dict[tuple[str, str], float]


def save_profiles(prom_url: str, directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    stem = name.replace(" ", "-")
    (directory / f"{stem}.heap.pb.gz").write_bytes(get(f"{prom_url}/debug/pprof/heap", TIMEOUT))
    (directory / f"{stem}.cpu.pb.gz").write_bytes(get(f"{prom_url}/debug/pprof/profile?seconds=30", TIMEOUT + 30))
    print(f"[{name}] profiles in {directory}/{stem}.*.pb.gz", flush=True)


def measure(name: str, server: Server, simulator: psutil.Process, warm_up: float, duration: float,
            profiles: Path | None) -> Run:
    print(f"[{name}] warming up for {warm_up:g} s", flush=True)
    time.sleep(warm_up)
    prom_url = server.url
    prom = psutil.Process(server.pid)
    before, cpu0, t0 = rule_group_metrics(prom_url, TIMEOUT), cpu_seconds(prom), time.monotonic()
    simulator_cpu0 = cpu_seconds(simulator)
    groups: dict[str, GroupFigures] = defaultdict(GroupFigures)
    slowest: dict[tuple[str, str], float] = defaultdict(float)
    print(f"[{name}] measuring for {duration:g} s", flush=True)
    for tick in range(int(duration // SAMPLE_SECONDS)):
        time.sleep(max(0.0, t0 + (tick + 1) * SAMPLE_SECONDS - time.monotonic()))
        for (metric, group), value in rule_group_metrics(prom_url, TIMEOUT).items():
            if metric == "prometheus_rule_group_last_duration_seconds":
                groups[group].durations.append(value)
            elif metric == "prometheus_rule_group_interval_seconds":
                groups[group].interval = value
        if tick % 3 == 0:
            for group in json.loads(get(f"{prom_url}/api/v1/rules", TIMEOUT))["data"]["groups"]:
                for rule in group["rules"]:
                    key = (group["name"], rule["name"])
                    slowest[key] = max(slowest[key], rule.get("evaluationTime", 0.0))
    elapsed = time.monotonic() - t0
    cpu_share = (cpu_seconds(prom) - cpu0) / elapsed
    simulator_cpu_share = (cpu_seconds(simulator) - simulator_cpu0) / elapsed
    after = rule_group_metrics(prom_url, TIMEOUT)
    for group, figures in groups.items():
        for metric, attribute in (("prometheus_rule_group_iterations_missed_total", "missed"),
                                  ("prometheus_rule_evaluation_failures_total", "failures")):
            setattr(figures, attribute, after[(metric, group)] - before[(metric, group)])
    window = f"{int(duration)}s"
    oldest = query_value(prom_url, OLDEST_SNAPSHOT.format(window=f"{window}:"), TIMEOUT)
    if profiles is not None:
        save_profiles(prom_url, profiles, name)
    return Run(name, cpu_share, peak_rss_mib(server.pid), after[("prometheus_tsdb_head_series", "")],
               query_value(prom_url, "avg(scrape_samples_scraped)", TIMEOUT) or 0.0, oldest, simulator_cpu_share,
               dict(groups), dict(slowest))


def write_config(workdir: Path, targets: Path, rules: Path | None, querylog: Path | None = None) -> Path:
    """The query log stays off while measuring: it would log, and cost, every rule evaluation."""
    return prometheus_config(workdir / "prometheus.yml", targets, f"{SCRAPE_SECONDS}s", rules, scrape_timeout="10s",
                             query_log=querylog)


def dashboard_targets(prom_url: str) -> list[tuple[str, str, bool, int]]:
    """(dashboard/panel, expression, instant, step in seconds) of every target, with what Grafana substitutes over
    an hour: All for a multi-select variable, the first value Prometheus lists for a single-select one (the node
    dashboard's node), and a step of the scrape interval or the panel's own minimum interval, whichever is longer.
    Grafana would ask an hour at 30 s where a panel sets no minimum (a step of the range over its 100 data
    points, rounded); 15 s is the stricter of the two."""
    directory = ROOT / "dashboards" / "json"
    chosen = {uid: {name: json.loads(get(f"{prom_url}/api/v1/label/{name}/values", TIMEOUT))["data"][0]
                    for name in names}  # Grafana escapes no single value.
              for uid, names in grafana.single_select(directory).items()}
    expanded = []
    for target in grafana.targets(directory):
        step = max(SCRAPE_SECONDS, round(parse_duration(target.interval or f"{SCRAPE_SECONDS}s")))
        expr = grafana.expand(target.expr, SCRAPE_SECONDS, step, "1h", chosen[target.uid])
        expanded.append((f"{target.uid}/{target.title}", expr, target.instant, step))
    return expanded


def timed_queries(querylog: Path, offset: int) -> list[tuple[float, str]]:
    """(seconds, query) of each query logged after `offset`, as Prometheus timed it."""
    timings = []
    with querylog.open() as log:
        log.seek(offset)
        for line in log:
            entry = json.loads(line)
            if "httpRequest" not in entry:  # A rule evaluation, not a query of ours.
                continue
            timings.append((entry["stats"]["timings"]["evalTotalTime"], entry["params"]["query"]))
    return timings


def time_dashboards_and_report(server: Server, querylog: Path) -> dict[str, list[float]]:
    """Every dashboard target and every capacity report query, timed by Prometheus's query log; printed, and
    returned as the seconds each took, by kind."""
    prom_url = server.url
    server.process.send_signal(signal.SIGHUP)  # Reload the configuration, now with the query log.
    for _ in range(100):
        time.sleep(0.1)
        if querylog.exists():
            break
    end = time.time()
    offset = querylog.stat().st_size if querylog.exists() else 0
    queries = dashboard_targets(prom_url)
    for _, expr, instant, step in queries:
        if instant:  # Grafana asks a table or stat with an instant target for one point, not a range.
            get(f"{prom_url}/api/v1/query?{urllib.parse.urlencode({'query': expr, 'time': end})}", timeout=300)
        else:
            params = urllib.parse.urlencode({"query": expr, "start": end - 3600, "end": end, "step": step})
            get(f"{prom_url}/api/v1/query_range?{params}", timeout=300)
    board = timed_queries(querylog, offset)
    offset = querylog.stat().st_size
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "gpufleet", "report", "capacity", f"--prometheus={prom_url}",
                        "--range=1h", f"--out={out}"], check=False, stdout=subprocess.DEVNULL, timeout=600)
    report = timed_queries(querylog, offset)
    names = {expr: name for name, expr, *_ in queries}
    timed = {"dashboard targets": board, "capacity report queries": report}
    for title, timings in timed.items():
        durations = [t for t, _ in timings]
        print(f"\n{title}: {len(timings)}, p50 {percentile(durations, 0.5) * 1000:.0f} ms, "
              f"p99 {percentile(durations, 0.99) * 1000:.0f} ms, max {max(durations, default=0) * 1000:.0f} ms; "
              "slowest ten:")
        for spent, expr in sorted(timings, reverse=True)[:10]:
            print(f"  {spent * 1000:8.0f} ms  {names.get(expr, '')} {expr[:150]}")
    return {title: [t for t, _ in timings] for title, timings in timed.items()}


def report_runs(runs: list[Run]) -> None:
    print(f"\n{'':<22}" + "".join(f"{run.name:>18}" for run in runs))
    rows = (("head series", lambda r: f"{r.head_series:,.0f}"),
            ("series per node", lambda r: f"{r.series_per_node:,.0f}"),
            ("Prometheus CPU", lambda r: f"{r.cpu_share * 100:.1f}% of a core"),
            ("Prometheus peak RSS", lambda r: f"{r.peak_rss_mib / 1024:.2f} GiB"),
            ("oldest GPU snapshot", lambda r: f"{r.oldest_snapshot or 0:.1f} s"),
            ("simulator CPU", lambda r: f"{r.simulator_cpu_share * 100:.0f}% of a core"))
    for label, cell in rows:
        print(f"{label:<22}" + "".join(f"{cell(run):>18}" for run in runs))
    if len(runs) == 2:
        base, ruled = runs
        print(f"the rules add {100 * (ruled.cpu_share / base.cpu_share - 1):+.0f}% CPU and "
              f"{100 * (ruled.peak_rss_mib / base.peak_rss_mib - 1):+.0f}% peak RSS")
    table = group_table(runs[-1])
    print(f"\n{'rule group':<24}{'interval':>9}{'p50 s':>9}{'p99 s':>9}{'max s':>9}{'p99/int':>9}{'missed':>8}"
          f"{'failed':>8}")
    for name, interval, p50, p99, worst, share, missed, failed in table.rows:
        print(f"{name:<24}{interval:>9g}{p50:>9.3f}{p99:>9.3f}{worst:>9.3f}{share:>9.1%}{missed:>8.0f}{failed:>8.0f}")
    print("\nten slowest rules (longest evaluation seen):")
    for (group, rule), spent in sorted(runs[-1].rules.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {spent:8.3f} s  {group} / {rule}")


def group_table(run: Run) -> results.Table:
    table = results.Table(["rule group", "interval (s)", "p50 (s)", "p99 (s)", "max (s)", "p99 / interval",
                           "missed", "failed"])
    for name, g in sorted(run.groups.items()):
        p99 = percentile(g.durations, 0.99)
        table.add(name, g.interval, percentile(g.durations, 0.5), p99, max(g.durations, default=0),
                  p99 / g.interval, g.missed, g.failures)
    return table


def figures(runs: list[Run], queries: dict[str, list[float]]) -> dict[str, results.Value]:
    ruled = runs[-1]
    single: dict[str, results.Value] = {
        "head series": ruled.head_series, "series per node": ruled.series_per_node,
        "Prometheus CPU (share of a core)": ruled.cpu_share, "Prometheus peak RSS (MiB)": ruled.peak_rss_mib,
        "oldest GPU snapshot (s)": ruled.oldest_snapshot, "simulator CPU (share of a core)": ruled.simulator_cpu_share}
    if len(runs) == 2:
        single["Prometheus CPU without rules (share of a core)"] = runs[0].cpu_share
        single["Prometheus peak RSS without rules (MiB)"] = runs[0].peak_rss_mib
    for title, durations in queries.items():
        single[f"{title} p99 (s)"] = percentile(durations, 0.99)
        single[f"{title} max (s)"] = max(durations, default=0.0)
    return single


def measure_both(args: argparse.Namespace, tmp: Path, targets: Path,
                 simulator_process: psutil.Process) -> tuple[list[Run], dict[str, list[float]]]:
    """Prometheus without the rules (unless skipped), then with them; the dashboards and report timed in the
    second."""
    runs, queries = [], {}
    for name, rules in ((("without rules", None),) if not args.skip_baseline else ()) + (("with rules", args.rules),):
        workdir = tmp / name.replace(" ", "-")
        workdir.mkdir()
        env = {**os.environ, "GOMEMLIMIT": args.gomemlimit} if args.gomemlimit else None
        with prometheus(write_config(workdir, targets, rules), workdir / "data", env=env, output="inherit") as server:
            runs.append(measure(name, server, simulator_process, args.warm_up, args.seconds, args.profiles))
            if rules is not None:
                querylog = workdir / "queries.log"
                write_config(workdir, targets, rules, querylog)
                queries = time_dashboards_and_report(server, querylog)
        shutil.rmtree(workdir / "data", ignore_errors=True)
    return runs, queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--warm-up", type=parse_duration, default=parse_duration("15m"), help="default 15m")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts" / "gpufleet-rules.yml")
    parser.add_argument("--skip-baseline", action="store_true", help="only the run with rules")
    parser.add_argument("--profiles", type=Path, help="save each server's heap and CPU profiles here")
    parser.add_argument("--gomemlimit", help="GOMEMLIMIT for both servers, as Go writes it (2560MiB, 3GiB)")
    parser.add_argument("--simulator-nice", type=int, default=0, metavar="N",
                        help="run the simulator at this niceness (1-19), so that Prometheus has the CPU first")
    results.add_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        targets = Path(tmp) / "targets.json"
        with simulator(targets, f"--nodes={args.nodes}", f"--collect-interval={SCRAPE_SECONDS}s", "--log.level=warn",
                       timeout=300, niceness=args.simulator_nice, output="inherit") as sim:
            runs, queries = measure_both(args, Path(tmp), targets, psutil.Process(sim.pid))
    print(f"\n{args.nodes} nodes x 8 GPUs, scraped and evaluated every {SCRAPE_SECONDS} s; "
          f"rules: {args.rules.name}" + (f"; GOMEMLIMIT={args.gomemlimit}" if args.gomemlimit else "")
          + (f"; simulator at nice {args.simulator_nice}" if args.simulator_nice else ""))
    report_runs(runs)
    results.record("rules_bench", figures(runs, queries), {"rule groups": group_table(runs[-1])}, path=args.results)


if __name__ == "__main__":
    main()
