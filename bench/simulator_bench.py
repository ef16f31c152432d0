"""Benchmark of `gpufleet simulate` scraped by a real Prometheus (Debian's package).

Usage: .venv/bin/python bench/simulator_bench.py [--nodes 1000] [--scrape-interval 15] [--seconds 180]

Starts the simulator with N nodes of 8 GPUs and a Prometheus that scrapes every
node through the simulator's file_sd targets, lets it warm up for two scrape
intervals, then measures over --seconds:

* CPU of the simulator and of Prometheus, as a share of one core;
* their peak resident memory;
* from Prometheus itself: targets up, series ingested per scrape, scrape
  duration (mean and p99), and how old the oldest GPU snapshot it scraped was,
  which says whether the simulator collects every node once per interval.

Everything listens on 127.0.0.1; loops are bounded by count and time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psutil

from gpufleet.devtools import results
from gpufleet.devtools.programs import prometheus, prometheus_config, simulator
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
    results.add_argument(parser)
    args = parser.parse_args()
    interval = args.scrape_interval
    with tempfile.TemporaryDirectory() as tmp:
        targets = Path(tmp) / "targets.json"
        started = time.monotonic()
        with simulator(targets, f"--nodes={args.nodes}", "--log.level=warn", timeout=120, output="inherit") as sim:
            simulator_start = time.monotonic() - started
            config = prometheus_config(Path(tmp) / "prometheus.yml", targets, f"{interval:g}s",
                                       scrape_timeout=f"{min(10.0, interval):g}s")
            with prometheus(config, Path(tmp) / "data", output="inherit") as prom:
                time.sleep(2 * interval)  # Warm-up: every target scraped at least once, caches filled.
                sim_process, prom_process = psutil.Process(sim.pid), psutil.Process(prom.pid)
                sim_cpu, prom_cpu, t0 = cpu_seconds(sim_process), cpu_seconds(prom_process), time.monotonic()
                time.sleep(args.seconds)
                elapsed = time.monotonic() - t0
                figures: dict[str, results.Value] = {
                    "simulator CPU (share of a core)": (cpu_seconds(sim_process) - sim_cpu) / elapsed,
                    "simulator peak RSS (MiB)": peak_rss_mib(sim.pid),
                    "Prometheus CPU (share of a core)": (cpu_seconds(prom_process) - prom_cpu) / elapsed,
                    "Prometheus peak RSS (MiB)": peak_rss_mib(prom.pid),
                    **measure(prom.url, f"{int(args.seconds)}s")}
    print(f"{args.nodes} nodes x 8 GPUs, scraped every {interval:g}s; simulator ready in {simulator_start:.1f}s")
    for program in ("simulator", "Prometheus"):
        print(f"{program.lower()}: {figures[f'{program} CPU (share of a core)'] * 100:.1f}% of one core, "
              f"peak RSS {figures[f'{program} peak RSS (MiB)']:.0f} MiB")
    for name, value in figures.items():
        if not name.startswith(("simulator ", "Prometheus ")):
            print(f"{name}: {value if not isinstance(value, float) else round(value, 3)}")
    results.record("simulator_bench", {"nodes": args.nodes, **figures}, path=args.results)


if __name__ == "__main__":
    main()
