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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from support import binary, cpu_seconds, free_port, get, peak_rss_mib, query, stop


def wait_until(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"{what} not ready within {seconds:g}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=180.0)
    args = parser.parse_args()
    prometheus_binary = binary("prometheus", "prometheus")

    with tempfile.TemporaryDirectory() as tmp:
        targets = Path(tmp) / "targets.json"
        sim_port, prom_port = free_port(), free_port()
        started = time.monotonic()
        simulator = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "simulate", f"--nodes={args.nodes}", f"--file-sd={targets}",
             f"--web.listen-address=127.0.0.1:{sim_port}", "--log.level=warn"])
        wait_until(lambda: get(f"http://127.0.0.1:{sim_port}/healthz") == b"ok\n", 120, "simulator")
        simulator_start = time.monotonic() - started
        interval = args.scrape_interval
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {interval:g}s, scrape_timeout: {min(10.0, interval):g}s}}\n"
            "scrape_configs:\n"
            f"  - job_name: gpufleet\n    file_sd_configs: [{{files: ['{targets}']}}]\n")
        prometheus = subprocess.Popen(
            [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        prom_url = f"http://127.0.0.1:{prom_port}"
        try:
            wait_until(lambda: get(f"{prom_url}/-/ready"), 60, "prometheus")
            time.sleep(2 * interval)  # Warm-up: every target scraped at least once, caches filled.
            sim, prom = psutil.Process(simulator.pid), psutil.Process(prometheus.pid)
            sim_cpu, prom_cpu, t0 = cpu_seconds(sim), cpu_seconds(prom), time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - t0
            sim_share = (cpu_seconds(sim) - sim_cpu) / elapsed
            prom_share = (cpu_seconds(prom) - prom_cpu) / elapsed
            window = f"{int(args.seconds)}s"
            results = {
                "targets up": query(prom_url, "count(up == 1)"),
                "targets down": query(prom_url, "count(up == 0)") or 0.0,
                "series per scrape, fleet": query(prom_url, "sum(scrape_samples_scraped)"),
                "scrape duration mean (s)": query(prom_url, f"avg(avg_over_time(scrape_duration_seconds[{window}]))"),
                "scrape duration p99 (s)": query(
                    prom_url, f"quantile(0.99, max_over_time(scrape_duration_seconds[{window}]))"),
                # Each node is collected once per interval; this says whether the simulator keeps up.
                "oldest GPU snapshot (s)": query(
                    prom_url, f'max(max_over_time((timestamp(gpufleet_collector_last_success_timestamp_seconds'
                              f'{{collector="gpu"}}) - gpufleet_collector_last_success_timestamp_seconds'
                              f'{{collector="gpu"}})[{window}:]))'),
            }
            print(f"{args.nodes} nodes x 8 GPUs, scraped every {interval:g}s; "
                  f"simulator ready in {simulator_start:.1f}s")
            print(f"simulator: {sim_share * 100:.1f}% of one core, peak RSS {peak_rss_mib(simulator.pid):.0f} MiB")
            print(f"prometheus: {prom_share * 100:.1f}% of one core, peak RSS {peak_rss_mib(prometheus.pid):.0f} MiB")
            for name, value in results.items():
                print(f"{name}: {value if value is None else round(value, 3)}")
        finally:
            for process in (prometheus, simulator):
                stop(process, 30)


if __name__ == "__main__":
    main()
