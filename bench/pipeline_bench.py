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

After --warm-up (12 minutes: the straggler rules read 11 minutes back) it measures over --seconds and
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
import json
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import (
    COMPOSE,
    VmalertIterations,
    binary,
    compose_flags,
    cpu_seconds,
    free_port,
    get,
    peak_rss_mib,
    percentile,
    query,
    rule_times,
    serve,
    serve_alertmanager,
    serve_victoriametrics,
    serve_vmalert,
    simulator_command,
    stop,
)

from gpufleet.alerts.cli import VMALERT_RULES_FILE
from gpufleet.duration import parse as parse_duration

ROOT = Path(__file__).resolve().parent.parent
SCRAPE = yaml.safe_load((ROOT / "compose" / "vmagent" / "scrape.yml").read_text())
AGENTS = sorted(name for name in COMPOSE["services"] if name.startswith("vmagent-"))
SAMPLE_SECONDS = 2.0
SCRAPE_SECONDS = 15  # compose's scrape interval and vmalert's -evaluationInterval.
TIMEOUT = 60.0


def own_metric(url: str, name: str, **labels: str) -> float:
    """The sum of a program's own metric over the samples with `labels`, from its /metrics (nothing here
    scrapes them)."""
    return sum(sample.value for family in text_string_to_metric_families(get(f"{url}/metrics", TIMEOUT).decode())
               for sample in family.samples if sample.name == name and labels.items() <= sample.labels.items())


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
    args = parser.parse_args()
    rules = yaml.safe_load(VMALERT_RULES_FILE.read_text())
    intervals = {g["name"]: parse_duration(g.get("interval", f"{SCRAPE_SECONDS}s")) for g in rules["groups"]}
    running: list[tuple[str, subprocess.Popen]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        try:
            targets = []
            share = [args.nodes // args.simulators + (n < args.nodes % args.simulators) for n in range(args.simulators)]
            for n, nodes in enumerate(share):
                port, targets_file = free_port(), workdir / f"sim-{n}.json"
                running.append((f"simulator {n}", serve([
                    *simulator_command(args.simulator_nice), f"--nodes={nodes}", f"--cluster=sim-{n}",
                    f"--seed={n}", f"--file-sd={targets_file}", f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn"], port, "/healthz")[0]))
                targets.append(str(targets_file))
            job = next(j for j in SCRAPE["scrape_configs"] if j["job_name"] == "gpufleet")
            scrape = workdir / "scrape.yml"
            scrape.write_text(yaml.safe_dump({"global": SCRAPE["global"], "scrape_configs": [
                {**job, "file_sd_configs": [{"files": targets}]}]}))
            vm, vm_url = serve_victoriametrics(workdir / "vm", tuple(args.victoriametrics_flag))
            running.append(("victoriametrics", vm))
            for name in AGENTS:
                port = free_port()
                running.append((name, serve([
                    binary("vmagent", "victoria-metrics"), f"-promscrape.config={scrape}",
                    f"-remoteWrite.url={vm_url}/api/v1/write", f"-remoteWrite.tmpDataPath={workdir / name}",
                    f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=ERROR",
                    *compose_flags(name, ("-promscrape.config", "-remoteWrite.url", "-remoteWrite.tmpDataPath",
                                          "-httpListenAddr")), *args.vmagent_flag], port)[0]))
            am, am_url = serve_alertmanager(workdir)
            running.append(("alertmanager", am))
            vmalert, vmalert_url = serve_vmalert(VMALERT_RULES_FILE, vm_url, am_url)
            running.append(("vmalert", vmalert))
            print(f"{args.nodes} nodes x 8 GPUs from {args.simulators} simulators"
                  + (f" at nice {args.simulator_nice}" if args.simulator_nice else "") + "; flags beside compose's: "
                  f"VictoriaMetrics {' '.join(args.victoriametrics_flag) or 'none'}, vmagents "
                  f"{' '.join(args.vmagent_flag) or 'none'}; warming up for {args.warm_up:g} s", flush=True)
            time.sleep(args.warm_up)
            processes = {name: psutil.Process(p.pid) for name, p in running}
            cpu0 = {name: cpu_seconds(p) for name, p in processes.items()}
            rows0 = own_metric(vm_url, "vm_rows_inserted_total")
            queued0 = own_metric(vm_url, "vm_concurrent_select_limit_reached_total")
            iterations = VmalertIterations(vmalert_url)
            began = time.monotonic()
            for tick in range(int(args.seconds / SAMPLE_SECONDS)):
                time.sleep(max(0.0, began + (tick + 1) * SAMPLE_SECONDS - time.monotonic()))
                iterations.sample()
            elapsed = time.monotonic() - began
            cpu = {name: (cpu_seconds(p) - cpu0[name]) / elapsed for name, p in processes.items()}
            rss = {name: peak_rss_mib(p.pid) for name, p in processes.items()}
            window = f"{int(args.seconds)}s"
            # A count() over every series is refused past -search.maxUniqueTimeseries: ask the store's own cache.
            series = own_metric(vm_url, "vm_cache_entries", type="storage/hour_metric_ids")
            rows = (own_metric(vm_url, "vm_rows_inserted_total") - rows0) / elapsed
            queued = own_metric(vm_url, "vm_concurrent_select_limit_reached_total") - queued0
            oldest = query(vm_url, 'max(max_over_time((timestamp(gpufleet_collector_last_success_timestamp_seconds'
                                   '{collector="gpu"}) - gpufleet_collector_last_success_timestamp_seconds'
                                   f'{{collector="gpu"}})[{window}:{SCRAPE_SECONDS}s]))', TIMEOUT)
            starts = group_starts(vmalert_url, intervals)
            stop(vmalert)
            alone = rule_times(vm_url, rules, time.time() // SCRAPE_SECONDS * SCRAPE_SECONDS)
        finally:
            for _, process in reversed(running):
                stop(process)
    print(f"\n{'rule group':<24}{'interval':>9}{'starts':>8}{'runs':>6}{'p50 s':>9}{'p99 s':>9}{'max s':>9}"
          f"{'max/int':>9}{'missed':>8}{'alone s':>9}{'worst at':>10}")
    for group, interval in intervals.items():
        seen = iterations.durations.get(group, [])
        missed = iterations.since_start("vmalert_iteration_missed_total", group)
        print(f"{group:<24}{interval:>9g}{starts.get(group, float('nan')):>8.1f}{len(seen):>6}"
              f"{percentile(seen, 0.5):>9.3f}{percentile(seen, 0.99):>9.3f}{max(seen, default=float('nan')):>9.3f}"
              f"{max(seen, default=float('nan')) / interval:>9.1%}{missed:>8.0f}"
              f"{sum(t for t, g, _ in alone if g == group):>9.3f}{worst_at(iterations, group):>10.0f}")
    print("(starts: seconds into its interval, by the clock, at which vmalert 1.79 evaluates the group; it places "
          "each group by a hash of the rule file's path and the group's name. alone: its rules' times summed, each "
          "asked alone after vmalert stopped. worst at: seconds into the 5 minutes by the clock at which its slowest "
          "evaluation began, within 2 s)")
    print(f"failed rule executions: {iterations.since_start('vmalert_execution_errors_total'):.0f}; queries that "
          f"waited for one of VictoriaMetrics's query slots: {queued:.0f}")
    print(f"active series in VictoriaMetrics: {series:,.0f}; rows taken in: {rows:,.0f}/s "
          "(every vmagent's copy of each sample, before deduplication)")
    print(f"oldest GPU snapshot scraped: {oldest or float('nan'):.1f} s (collection every 15 s)")
    print("\nten slowest rules, each asked alone after vmalert stopped (median of three):")
    for seconds, group, name in alone[:10]:
        print(f"{seconds:>8.3f} s  {group:<24}{name}")
    print(f"\n{'program':<18}{'cores':>8}{'peak RSS MiB':>14}")
    for name in processes:
        print(f"{name:<18}{cpu[name]:>8.2f}{rss[name]:>14.0f}")
    print(f"{'all':<18}{sum(cpu.values()):>8.2f}{sum(rss.values()):>14.0f}")


if __name__ == "__main__":
    main()
