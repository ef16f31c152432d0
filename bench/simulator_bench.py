"""Benchmark of `gpufleet simulate` scraped by a real Prometheus (Debian's package).

Usage: .venv/bin/python bench/simulator_bench.py [--nodes 1000] [--scrape-interval 15] [--seconds 180]
                                                  [--node-exporters]

Starts the simulator with N nodes of 8 GPUs and a Prometheus that scrapes every
node through the simulator's file_sd targets, lets it warm up for two scrape
intervals, then measures over --seconds:

* CPU of the simulator and of Prometheus, as a share of one core;
* their peak resident memory;
* from Prometheus itself: targets up, series ingested per scrape, scrape
  duration (mean and p99), and how old the oldest GPU snapshot it scraped was,
  which says whether the simulator collects every node once per interval.

With --node-exporters, the node_exporter mode of the end-to-end test: the simulator
collects at the scrape interval and writes each node's sysfs and procfs out
(`--node-exporter-root`), a real node_exporter per node reads them, and Prometheus
scrapes both; the node_exporters' CPU and memory are added, summed over the nodes.

Everything listens on 127.0.0.1; loops are bounded by count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from gpufleet.devtools import results
from gpufleet.devtools.paths import memory_directory
from gpufleet.devtools.programs import node_exporters, prometheus, prometheus_config, scrape_jobs, simulator
from gpufleet.devtools.prom import OLDEST_SNAPSHOT, query_value
from gpufleet.devtools.resources import cpu_seconds, peak_rss_mib


def measure(prom_url: str, window: str) -> dict[str, results.Value]:
    """What Prometheus saw of the fleet over `window`."""
    return {
        "targets up": query_value(prom_url, "count(up == 1)"),
        "targets down": query_value(prom_url, "count(up == 0)") or 0.0,
        "series per scrape, fleet": query_value(prom_url, "sum(scrape_samples_scraped)"),
        "scrape duration mean (s)": query_value(prom_url, f"avg(avg_over_time(scrape_duration_seconds[{window}]))"),
        "scrape duration p99 (s)": query_value(
            prom_url, f"quantile(0.99, max_over_time(scrape_duration_seconds[{window}]))"),
        "oldest GPU snapshot (s)": query_value(prom_url, OLDEST_SNAPSHOT.format(window=f"{window}:")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--node-exporters", action="store_true",
                        help="write each node's trees out and run a node_exporter per node over them")
    results.add_argument(parser)
    args = parser.parse_args()
    interval = args.scrape_interval
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        targets, root = Path(tmp) / "targets.json", stack.enter_context(memory_directory())
        beside = [f"--node-exporter-root={root}", f"--collect-interval={interval:g}s"] if args.node_exporters else []
        started = time.monotonic()
        sim = stack.enter_context(simulator(targets, f"--nodes={args.nodes}", "--log.level=warn", *beside,
                                            timeout=120, output="inherit"))
        simulator_start = time.monotonic() - started
        config = prometheus_config(Path(tmp) / "prometheus.yml", targets, f"{interval:g}s",
                                   scrape_timeout=f"{min(10.0, interval):g}s")
        nodes: list[psutil.Process] = []
        if args.node_exporters:
            node_targets = Path(tmp) / "node-targets.json"
            nodes = [psutil.Process(server.pid) for server in node_exporters(stack, root, targets, node_targets)]
            settings = yaml.safe_load(config.read_text())
            settings["scrape_configs"] += scrape_jobs(node_targets, job="node")
            config.write_text(yaml.safe_dump(settings))
        prom = stack.enter_context(prometheus(config, Path(tmp) / "data", output="inherit"))
        time.sleep(2 * interval)  # Warm-up: every target scraped at least once, caches filled.
        sim_process, prom_process = psutil.Process(sim.pid), psutil.Process(prom.pid)
        sim_cpu, prom_cpu, t0 = cpu_seconds(sim_process), cpu_seconds(prom_process), time.monotonic()
        node_cpu = sum(cpu_seconds(process) for process in nodes)
        time.sleep(args.seconds)
        elapsed = time.monotonic() - t0
        figures: dict[str, results.Value] = {
            "simulator CPU (share of a core)": (cpu_seconds(sim_process) - sim_cpu) / elapsed,
            "simulator peak RSS (MiB)": peak_rss_mib(sim.pid),
            "Prometheus CPU (share of a core)": (cpu_seconds(prom_process) - prom_cpu) / elapsed,
            "Prometheus peak RSS (MiB)": peak_rss_mib(prom.pid),
            **measure(prom.url, f"{int(args.seconds)}s")}
        if nodes:
            figures["node_exporters CPU (share of a core)"] = (
                sum(cpu_seconds(process) for process in nodes) - node_cpu) / elapsed
            figures["node_exporters peak RSS (MiB)"] = sum(peak_rss_mib(process.pid) for process in nodes)
    mode = ", with a node_exporter each" if args.node_exporters else ""
    print(f"{args.nodes} nodes x 8 GPUs{mode}, scraped every {interval:g}s; simulator ready in {simulator_start:.1f}s")
    for program in ("simulator", "Prometheus", "node_exporters")[:3 if args.node_exporters else 2]:
        print(f"{program.lower()}: {figures[f'{program} CPU (share of a core)'] * 100:.1f}% of one core, "
              f"peak RSS {figures[f'{program} peak RSS (MiB)']:.0f} MiB")
    for name, value in figures.items():
        if not name.startswith(("simulator ", "Prometheus ", "node_exporters ")):
            print(f"{name}: {value if not isinstance(value, float) else round(value, 3)}")
    results.record("simulator_bench", {"nodes": args.nodes, **figures}, path=args.results)


if __name__ == "__main__":
    main()
