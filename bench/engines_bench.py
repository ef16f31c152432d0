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
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from support import binary, cpu_seconds, free_port, peak_rss_mib, query, serve, start_simulator, stop

from gpufleet.duration import parse as parse_duration

SCRAPE_SECONDS = 15


@dataclass
class Program:
    """One running program, and the queries of its own metrics (in `source`, the store that scraped them) that
    count the series it holds and the samples it has taken in."""

    name: str
    process: subprocess.Popen
    source: str
    series: str
    samples_total: str
    data: Path | None = None

    def metric(self, promql: str) -> float:
        return query(self.source, promql) or 0.0


def scrape_config(targets: Path, own: list[tuple[str, int]], path: Path) -> Path:
    """The fleet as job `gpufleet`, and each program's own metrics as a job of its name."""
    lines = [f"global: {{scrape_interval: {SCRAPE_SECONDS}s, scrape_timeout: 10s}}", "scrape_configs:",
             f"  - job_name: gpufleet\n    file_sd_configs: [{{files: ['{targets}']}}]"]
    lines += [f"  - job_name: {job}\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]" for job, port in own]
    path.write_text("\n".join(lines) + "\n")
    return path


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure_size(nodes: int, warm_up: float, seconds: float, workdir: Path) -> list[dict[str, float | str]]:
    targets = workdir / "targets.json"
    prom_port, vm_port, agent_port = (free_port() for _ in range(3))
    simulator = start_simulator(nodes, targets, SCRAPE_SECONDS)
    running: list[subprocess.Popen] = [simulator]
    try:
        own = [("prometheus", prom_port), ("victoriametrics", vm_port), ("vmagent", agent_port)]
        prom_config = scrape_config(targets, own[:1], workdir / "prometheus.yml")
        agent_config = scrape_config(targets, own[1:], workdir / "vmagent.yml")
        prom, prom_url = serve([
            binary("prometheus", "prometheus"), f"--config.file={prom_config}",
            f"--storage.tsdb.path={workdir / 'prometheus'}", f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn"], prom_port, "/-/ready")
        running.append(prom)
        vm, vm_url = serve([
            binary("victoria-metrics", "victoria-metrics"), f"-storageDataPath={workdir / 'victoriametrics'}",
            f"-httpListenAddr=127.0.0.1:{vm_port}", "-loggerLevel=ERROR"], vm_port, "/health")
        running.append(vm)
        agent, _ = serve([
            binary("vmagent", "victoria-metrics"), f"-promscrape.config={agent_config}",
            f"-remoteWrite.url={vm_url}/api/v1/write", f"-remoteWrite.tmpDataPath={workdir / 'vmagent'}",
            f"-httpListenAddr=127.0.0.1:{agent_port}", "-loggerLevel=ERROR"], agent_port, "/health")
        running.append(agent)
        programs = [
            Program("prometheus", prom, prom_url, "prometheus_tsdb_head_series",
                    "prometheus_tsdb_head_samples_appended_total", workdir / "prometheus"),
            Program("victoriametrics", vm, vm_url,
                    'vm_cache_entries{job="victoriametrics", type="storage/hour_metric_ids"}',
                    'sum(vm_rows_inserted_total{job="victoriametrics"})', workdir / "victoriametrics"),
            Program("vmagent", agent, vm_url, 'sum(scrape_samples_scraped{job="gpufleet"})',
                    'sum(vm_promscrape_scraped_samples_sum{job="vmagent"})'),
        ]
        time.sleep(warm_up)
        # VictoriaMetrics answers for samples 30 s old: wait, a bounded time, until every count has data.
        for _ in range(60):
            if all(p.metric(p.series) > 0 and p.metric(p.samples_total) > 0 for p in programs):
                break
            time.sleep(2)
        else:
            raise SystemExit("the programs' own metrics did not reach their stores within 2 minutes")
        processes = {p.name: psutil.Process(p.process.pid) for p in programs}
        processes["simulator"] = psutil.Process(simulator.pid)
        cpu_before = {name: cpu_seconds(process) for name, process in processes.items()}
        before = {p.name: (p.metric(p.samples_total), disk_bytes(p.data) if p.data else 0) for p in programs}
        time.sleep(seconds)
        rows: list[dict[str, float | str]] = []
        for p in programs:
            samples0, disk0 = before[p.name]
            cpu = cpu_seconds(processes[p.name]) - cpu_before[p.name]
            samples = p.metric(p.samples_total) - samples0
            series = p.metric(p.series)
            rss = processes[p.name].memory_info().rss / 2**20
            rows.append({
                "program": p.name, "series": series, "samples/s": samples / seconds, "cores": cpu / seconds,
                "core-s per 1M samples": cpu / max(samples, 1) * 1e6, "RSS MiB": rss,
                "peak RSS MiB": peak_rss_mib(p.process.pid), "MiB per 1M series": rss / max(series, 1) * 1e6,
                "disk bytes per sample": (disk_bytes(p.data) - disk0) / max(samples, 1) if p.data else float("nan"),
            })
        rows.append({"program": "simulator",
                     "cores": (cpu_seconds(processes["simulator"]) - cpu_before["simulator"]) / seconds})
        return rows
    finally:
        for process in reversed(running):
            stop(process)


def print_rows(nodes: int, rows: list[dict[str, float | str]]) -> None:
    columns = ["series", "samples/s", "cores", "core-s per 1M samples", "RSS MiB", "peak RSS MiB",
               "MiB per 1M series", "disk bytes per sample"]
    print(f"\n{nodes} nodes x 8 GPUs ({nodes * 8} GPUs), scraped every {SCRAPE_SECONDS} s by both")
    print(f"{'program':<16}" + "".join(f"{c:>23}" for c in columns))
    for row in rows:
        print(f"{row['program']:<16}" + "".join(f"{row.get(c, float('nan')):>23,.2f}" for c in columns), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[250, 750])
    parser.add_argument("--warm-up", type=parse_duration, default=parse_duration("5m"), help="default 5m")
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory() as tmp:
            print_rows(nodes, measure_size(nodes, args.warm_up, args.seconds, Path(tmp)))


if __name__ == "__main__":
    main()
