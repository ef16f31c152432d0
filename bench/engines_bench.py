"""Prometheus 2.42 beside vmagent and VictoriaMetrics, over one simulated fleet, at several sizes.

Usage: .venv/bin/python bench/engines_bench.py [--nodes 250 750] [--warm-up 5m] [--seconds 300]

For each size, starts the simulator with N nodes of 8 GPUs, then Prometheus (no rules) and a vmagent
writing to a single-node VictoriaMetrics, all on 127.0.0.1 with fresh storage, both scraping every
target every 15 s at the same time. After --warm-up it measures over --seconds and prints, for each
program: active series, samples a second, CPU (cores, and core-seconds per million samples),
resident memory at the end and at its peak, memory per million active series, and the bytes its
storage grew by per sample. Prometheus counts its head series; VictoriaMetrics the series that
received a sample in the current hour; vmagent the series it scraped from the fleet.

Both stores hold only --warm-up plus --seconds of data, where a server in production holds two to
three hours in Prometheus's head and a day of index in VictoriaMetrics's caches: the figures are a
lower bound of production memory for both, measured alike. Every loop is bounded by count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from gpufleet.devtools import results
from gpufleet.devtools.net import free_port
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import prometheus, prometheus_config, scrape_jobs, simulator, victoria_metrics, vmagent
from gpufleet.devtools.prom import query_value
from gpufleet.devtools.resources import cpu_seconds, disk_bytes, peak_rss_mib
from gpufleet.devtools.waiting import wait_for
from gpufleet.duration import parse as parse_duration

SCRAPE_SECONDS = 15
COLUMNS = ["series", "samples/s", "cores", "core-s per 1M samples", "RSS MiB", "peak RSS MiB", "MiB per 1M series",
           "disk bytes per sample"]


@dataclass
class Program:
    """One running program, and the queries of its own metrics (in `source`, the store that scraped them) that
    count the series it holds and the samples it has taken in."""

    name: str
    server: Server
    source: str
    series: str
    samples_total: str
    data: Path | None = None

    def metric(self, promql: str) -> float:
        return query_value(self.source, promql) or 0.0


def start_stores(stack: contextlib.ExitStack, workdir: Path, targets: Path) -> list[Program]:
    """Prometheus, and vmagent writing to VictoriaMetrics, both scraping the fleet; each store also scrapes its
    programs' own metrics."""
    prom_port, vm_port, agent_port = (free_port() for _ in range(3))
    prom_config = prometheus_config(workdir / "prometheus.yml", targets, f"{SCRAPE_SECONDS}s", scrape_timeout="10s",
                                    own={"prometheus": prom_port})
    agent_config = workdir / "vmagent.yml"
    agent_config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": "10s"},
        "scrape_configs": scrape_jobs(targets, own={"victoriametrics": vm_port, "vmagent": agent_port}, refresh=None)}))
    prom = stack.enter_context(prometheus(prom_config, workdir / "prometheus", port=prom_port, timeout=120,
                                          output="discard"))
    vm = stack.enter_context(victoria_metrics(workdir / "victoriametrics", "-loggerLevel=ERROR", port=vm_port,
                                              timeout=120, output="discard"))
    agent = stack.enter_context(vmagent(agent_config, vm.url, workdir / "vmagent", "-loggerLevel=ERROR",
                                        port=agent_port, timeout=120, output="discard"))
    return [
        Program("prometheus", prom, prom.url, "prometheus_tsdb_head_series",
                "prometheus_tsdb_head_samples_appended_total", workdir / "prometheus"),
        Program("victoriametrics", vm, vm.url,
                'vm_cache_entries{job="victoriametrics", type="storage/hour_metric_ids"}',
                'sum(vm_rows_inserted_total{job="victoriametrics"})', workdir / "victoriametrics"),
        Program("vmagent", agent, vm.url, 'sum(scrape_samples_scraped{job="gpufleet"})',
                'sum(vm_promscrape_scraped_samples_sum{job="vmagent"})'),
    ]


def row(p: Program, process: psutil.Process, cpu: float, samples: float, disk: int,
        seconds: float) -> list[results.Value]:
    series = p.metric(p.series)
    rss = process.memory_info().rss / 2**20
    return [p.name, series, samples / seconds, cpu / seconds, cpu / max(samples, 1) * 1e6, rss,
            peak_rss_mib(p.server.pid), rss / max(series, 1) * 1e6,
            (disk_bytes(p.data) - disk) / max(samples, 1) if p.data else None]


def measure_size(nodes: int, warm_up: float, seconds: float, workdir: Path) -> results.Table:
    targets = workdir / "targets.json"
    table = results.Table(["program", *COLUMNS])
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(simulator(targets, f"--nodes={nodes}", f"--collect-interval={SCRAPE_SECONDS}s",
                                            "--log.level=warn", timeout=300, output="inherit"))
        programs = start_stores(stack, workdir, targets)
        time.sleep(warm_up)
        # VictoriaMetrics answers for samples 30 s old: wait, a bounded time, until every count has data.
        wait_for(lambda: all(p.metric(p.series) > 0 and p.metric(p.samples_total) > 0 for p in programs), 120,
                 "the programs' own metrics in their stores", interval=2)
        processes = {p.name: psutil.Process(p.server.pid) for p in programs} | {"simulator": psutil.Process(sim.pid)}
        cpu_before = {name: cpu_seconds(process) for name, process in processes.items()}
        before = {p.name: (p.metric(p.samples_total), disk_bytes(p.data) if p.data else 0) for p in programs}
        time.sleep(seconds)
        for p in programs:
            samples0, disk0 = before[p.name]
            table.add(*row(p, processes[p.name], cpu_seconds(processes[p.name]) - cpu_before[p.name],
                           p.metric(p.samples_total) - samples0, disk0, seconds))
        simulator_cores = (cpu_seconds(processes["simulator"]) - cpu_before["simulator"]) / seconds
        table.add("simulator", None, None, simulator_cores, None, None, None, None, None)
    return table


def print_rows(nodes: int, table: results.Table) -> None:
    print(f"\n{nodes} nodes x 8 GPUs ({nodes * 8} GPUs), scraped every {SCRAPE_SECONDS} s by both")
    print(f"{'program':<16}" + "".join(f"{c:>23}" for c in COLUMNS))
    for name, *cells in table.rows:
        print(f"{name:<16}" + "".join(f"{float('nan') if c is None else c:>23,.2f}" for c in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[250, 750])
    parser.add_argument("--warm-up", type=parse_duration, default=parse_duration("5m"), help="default 5m")
    parser.add_argument("--seconds", type=float, default=300.0)
    results.add_argument(parser)
    args = parser.parse_args()
    tables = {}
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory() as tmp:
            tables[f"{nodes} nodes"] = measure_size(nodes, args.warm_up, args.seconds, Path(tmp))
        print_rows(nodes, tables[f"{nodes} nodes"])
    results.record("engines_bench", {"nodes": " ".join(map(str, args.nodes))}, tables, path=args.results)


if __name__ == "__main__":
    main()
