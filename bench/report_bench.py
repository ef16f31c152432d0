"""Benchmark of `gpufleet report capacity` over 30 days of a 1,000-node fleet, against a real Prometheus.

Usage: .venv/bin/python bench/report_bench.py [--nodes 1000] [--days 30] [--keep DIR]

The report reads what the `gpufleet-capacity-*` rule groups record every 5 minutes, so this writes
those series directly, as Prometheus would hold them after the rules ran for the whole range: the
per-cluster and per-model aggregates, one series per job, per link (8 InfiniBand ports a node, both
directions: 16,000 series at 1,000 nodes, most of the data), and the sparse per-GPU series of a
few faulty GPUs. It imports them with `promtool tsdb create-blocks-from openmetrics` in day-long
blocks, starts Debian's Prometheus on them (127.0.0.1), waits until Prometheus has finished
compacting them, then times the report twice and lists its slowest queries from Prometheus's
query log.

What it leaves out: the raw exporter series, which the report reads only at the end of the range
(`gpufleet_gpu_info`) or only for GPUs with XIDs, so their history costs the report nothing; and
the cost of evaluating the rules, which Prometheus pays every 5 minutes, not at report time.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpufleet.alerts import capacity as rec
from gpufleet.devtools import results
from gpufleet.devtools.programs import binary, gpufleet_command, prometheus
from gpufleet.devtools.prom import own_metric
from gpufleet.devtools.waiting import HarnessError

INTERVAL = 300
GPUS = 8
PORTS = 8
NODES_PER_JOB = 4
MEMORY = 85520809984
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
NAN = float("nan")


@dataclass(frozen=True)
class Job:
    id: str
    first: int  # Node index of the job's first node.
    start: int  # Epoch seconds.
    end: int
    busy: float  # Mean utilisation of its GPUs.


def plan(nodes: int, start: int, end: int) -> list[Job]:
    """Back-to-back jobs on groups of four nodes, half a day to four days each; one group in seven idle."""
    rng = random.Random(0)
    jobs = []
    for first in range(0, nodes - NODES_PER_JOB + 1, NODES_PER_JOB):
        if first // NODES_PER_JOB % 7 == 6:
            continue
        t = start - rng.randrange(0, 2 * 86400)
        while t < end:
            length = rng.randrange(43200, 4 * 86400)
            jobs.append(Job(str(100000 + len(jobs)), first, t, t + length, rng.uniform(0.3, 0.98)))
            t += length + rng.randrange(0, 7200)
    return jobs


class Day:
    """One day of every recorded series at `stamps`, written family by family as OpenMetrics."""

    def __init__(self, out: TextIO, stamps: list[int], nodes: int, jobs: list[Job]) -> None:
        self.out, self.stamps, self.nodes, self.jobs = out, stamps, nodes, jobs
        self.model_of = [MODELS[0] if n < nodes // 2 else MODELS[1] for n in range(nodes)]
        self.running = [[j for j in jobs if j.start <= t < j.end] for t in stamps]
        self.lost = {(3, 5): (stamps[0], stamps[0] + 3 * 3600)}  # Node 3, GPU 5 off the bus for three hours a day.
        self.samples = 0

    def write(self) -> int:
        """Every family, then the end marker; returns the number of samples."""
        self._aggregates()
        self._faulty_gpus()
        self._jobs()
        self._links()
        self._inventory()
        self.out.write("# EOF\n")
        return self.samples

    def family(self, name: str, rows: list[tuple[str, list[float]]]) -> None:
        self.out.write(f"# TYPE {name} unknown\n")
        for labels, values in rows:
            self.out.writelines(f"{name}{{{labels}}} {v:.4g} {t}\n" for t, v in zip(self.stamps, values, strict=True)
                                if v == v)
            self.samples += sum(1 for v in values if v == v)

    def _per_model(self) -> dict[str, list[list[float]]]:
        """Per GPU model: GPUs installed, allocated, busy (utilisation summed) and lost, at each stamp."""
        per_model = {}
        for model in MODELS:
            installed = [float(self.model_of.count(model) * GPUS)] * len(self.stamps)
            allocated = [float(sum(NODES_PER_JOB * GPUS for j in now if self.model_of[j.first] == model))
                         for now in self.running]
            busy = [sum(NODES_PER_JOB * GPUS * j.busy for j in now if self.model_of[j.first] == model)
                    for now in self.running]
            down = [float(sum(1 for (n, _), (a, b) in self.lost.items() if self.model_of[n] == model and a <= t < b))
                    for t in self.stamps]
            per_model[model] = [installed, allocated, busy, down]
        return per_model

    def _aggregates(self) -> None:
        """The per-cluster and per-model series: GPUs by state, usage, memory and power."""
        per_model = self._per_model()

        def rows(pick: Callable[..., list[float]]) -> list[tuple[str, list[float]]]:
            return [(f'cluster="bench",name="{m}"', pick(*per_model[m])) for m in MODELS]

        states = {"installed": lambda i, a, b, d: i, "allocated": lambda i, a, b, d: a,
                  "idle": lambda i, a, b, d: [x - y - z for x, y, z in zip(i, a, d, strict=True)],
                  "lost": lambda i, a, b, d: [x or NAN for x in d]}
        self.family(rec.GPUS, [(f'{labels},state="{state}"', values)
                               for state, pick in states.items() for labels, values in rows(pick)])
        self.family(rec.USED, rows(lambda i, a, b, d: b))
        self.family(rec.ALLOCATED_USED, rows(lambda i, a, b, d: b))
        self._buckets()
        self.family(rec.MEMORY_FREE,
                    rows(lambda i, a, b, d: [MEMORY * (x - 0.8 * y) for x, y in zip(a, b, strict=True)]))
        self.family(rec.MEMORY_TOTAL, rows(lambda i, a, b, d: [MEMORY * x for x in a]))
        self.family(rec.MEMORY_TIGHT, rows(lambda i, a, b, d: [x * 0.1 for x in a]))
        self.family(rec.MEMORY_LOWEST, rows(lambda i, a, b, d: [0.05] * len(a)))

        def power(i: list[float], a: list[float], b: list[float], d: list[float]) -> list[float]:
            return [100 * (x - z) + 600 * y for x, y, z in zip(i, b, d, strict=True)]

        self.family(rec.ENERGY, rows(power))
        self.family(rec.POWER, rows(power))
        self.family(rec.POWER_GPUS, rows(lambda i, a, b, d: [x - z for x, z in zip(i, d, strict=True)]))
        self.family(rec.POWER_OF_LIMIT, rows(lambda *m: [p / 700 for p in power(*m)]))
        self.family(rec.POWER_CAPPED, rows(lambda i, a, b, d: [x * 0.02 for x in a]))

    def _buckets(self) -> None:
        """Allocated GPUs counted per 5 % bucket of utilisation, per model."""
        self.out.write(f"# TYPE {rec.ALLOCATED_BUCKETS} unknown\n")
        for index, t in enumerate(self.stamps):
            for model in MODELS:
                counts: dict[float, int] = {}
                for j in self.running[index]:
                    if self.model_of[j.first] == model:
                        bucket = int(rec.BUCKETS * j.busy) / rec.BUCKETS
                        counts[bucket] = counts.get(bucket, 0) + NODES_PER_JOB * GPUS
                self.out.writelines(
                    f'{rec.ALLOCATED_BUCKETS}{{bucket="{b:g}",cluster="bench",name="{model}"}} {n} {t}\n'
                    for b, n in counts.items())
                self.samples += len(counts)

    def _gpu(self, n: int, g: int) -> str:
        return f'cluster="bench",gpu="{g}",instance="gpu-node-{n + 1:04d}",name="{self.model_of[n]}"'

    def _faulty_gpus(self) -> None:
        """The sparse per-GPU and per-node series: a few GPUs with ECC errors, pending remaps or off the bus, and
        stragglers."""
        stamps, gpu = self.stamps, self._gpu
        self.family(rec.ECC, [(gpu(n, 1), [2.0] * len(stamps)) for n in range(0, self.nodes, 200)])
        self.family(rec.REMAP_PENDING, [(gpu(n, 2), [1.0 if i < 24 else NAN for i in range(len(stamps))])
                                        for n in range(100, self.nodes, 250)])
        self.family(rec.LOST, [(gpu(n, g), [1.0 if a <= t < b else NAN for t in stamps])
                               for (n, g), (a, b) in self.lost.items()])
        slowed = [j for j in self.jobs if int(j.id) % 50 == 0 and j.start < stamps[-1] and j.end > stamps[0]]
        self.family(rec.STRAGGLING, [
            (f'cluster="bench",instance="gpu-node-{j.first + 2:04d}",job_id="{j.id}",scheduler="slurm"',
             [0.6 if j.start + 3600 <= t < j.start + 7200 else NAN for t in stamps]) for j in slowed])

    def _jobs(self) -> None:
        live = [j for j in self.jobs if j.start <= self.stamps[-1] and j.end > self.stamps[0]]

        def labels(j: Job) -> str:
            return f'cluster="bench",job_id="{j.id}",namespace="",pod="",scheduler="slurm"'

        def within(j: Job, v: float) -> list[float]:
            return [v if j.start <= t < j.end else NAN for t in self.stamps]

        self.family(rec.JOB_GPUS, [(labels(j), within(j, NODES_PER_JOB * GPUS)) for j in live])
        self.family(rec.JOB_NODES, [(labels(j), within(j, NODES_PER_JOB)) for j in live])
        self.family(rec.JOB_USED, [(labels(j), within(j, NODES_PER_JOB * GPUS * j.busy)) for j in live])

    def _links(self) -> None:
        """Every port's utilisation in both directions, following its node's job: most of the data."""
        self.out.write(f"# TYPE {rec.LINKS} unknown\n")
        busy_at = [[0.01] * self.nodes for _ in self.stamps]
        for index, now in enumerate(self.running):
            for j in now:
                for n in range(j.first, j.first + NODES_PER_JOB):
                    busy_at[index][n] = j.busy
        for n in range(self.nodes):
            for p in range(PORTS):
                for direction in ("transmit", "receive"):
                    labels = (f'class="infiniband",cluster="bench",device="mlx5_{p}",direction="{direction}",'
                              f'instance="gpu-node-{n + 1:04d}",job="gpufleet",port="1"')
                    self.out.writelines(
                        f"{rec.LINKS}{{{labels}}} {busy_at[i][n] * (0.9 + (i * 7 + p) % 11 / 100):.3g} {t}\n"
                        for i, t in enumerate(self.stamps))
                    self.samples += len(self.stamps)

    def _inventory(self) -> None:
        self.out.write("# TYPE gpufleet_gpu_info unknown\n")
        for n in range(self.nodes):
            for g in range(GPUS):
                self.out.write(f'gpufleet_gpu_info{{{self._gpu(n, g)},job="gpufleet",uuid="GPU-{n:08d}-{g:04d}"}} 1 '
                               f"{self.stamps[-1]}\n")
        self.samples += self.nodes * GPUS


def settle(url: str, quiet: float = 90, limit: float = 1800) -> float:
    """Wait until Prometheus has compacted the imported blocks: no compaction and no block change for `quiet` s."""
    started = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - started < limit:
        now = (own_metric(url, "prometheus_tsdb_compactions_total"), own_metric(url, "prometheus_tsdb_blocks_loaded"))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        time.sleep(10)
    return time.monotonic() - started


def slowest(log: Path, count: int = 5) -> list[tuple[float, str]]:
    """The `count` slowest queries of the log, by Prometheus's own execution time."""
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    timed = sorted(((e["stats"]["timings"]["execTotalTime"], e["params"]["query"]) for e in entries), reverse=True)
    return timed[:count]


def history(work: Path, nodes: int, days: int, start: int, end: int) -> tuple[int, int]:
    """The recorded series of `days` written and imported a day at a time, one day written while promtool imports
    the one before; returns the samples written and the jobs run."""
    jobs = plan(nodes, start, end)
    samples, importing = 0, None
    for day in range(days):
        path = work / f"day-{day:02d}.om"
        first = start + day * 86400 + INTERVAL
        with path.open("w") as out:
            samples += Day(out, list(range(first, first + 86400, INTERVAL)), nodes, jobs).write()
        if importing is not None and importing.wait() != 0:
            raise HarnessError("promtool failed")
        importing = subprocess.Popen([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                                      "--max-block-duration=24h", str(path), str(work / "data")],
                                     stdout=subprocess.DEVNULL)
        print(f"  day {day + 1}/{days} written, {samples:,} samples so far", flush=True)
    if importing is not None and importing.wait() != 0:
        raise HarnessError("promtool failed")
    for path in work.glob("day-*.om"):
        path.unlink()
    return samples, len(jobs)


def time_reports(work: Path, url: str, days: int, end: int) -> results.Table:
    """The report twice, each timed, with its slowest queries."""
    table = results.Table(["run", "exit", "wall (s)", "queries", "slowest query (s)"])
    for attempt in ("first", "second"):
        (work / "queries.log").write_text("")
        began = time.monotonic()
        report = subprocess.run(gpufleet_command("report", "capacity", f"--prometheus={url}", f"--range={days}d",
                                         f"--end={end}", f"--out={work / 'report'}"), capture_output=True, text=True)
        wall = time.monotonic() - began
        queries = len((work / "queries.log").read_text().splitlines())
        slow = slowest(work / "queries.log")
        print(f"report ({attempt} run): exit {report.returncode} in {wall:.1f}s wall; "
              f"{report.stderr.strip().splitlines()[-1]}", flush=True)
        print("\n".join(["slowest queries (Prometheus execution time):",
                         *(f"  {t:6.2f}s  {q[:100]}" for t, q in slow)]))
        table.add(attempt, report.returncode, round(wall, 1), queries, slow[0][0] if slow else None)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="keep the data and the report here")
    results.add_argument(parser)
    args = parser.parse_args()
    end = int(time.time()) // 3600 * 3600 - 3600
    start = end - args.days * 86400
    work = Path(tempfile.mkdtemp(prefix="report-bench-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        samples, jobs = history(work, args.nodes, args.days, start, end)
        written = time.monotonic() - started
        print(f"history: {args.nodes} nodes, {args.nodes * GPUS} GPUs, {jobs:,} jobs, {args.days} days of "
              f"recorded series every {INTERVAL}s, {samples:,} samples, written and imported in {written:.0f}s",
              flush=True)
        config = work / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1m\n  query_log_file: {work / 'queries.log'}\n")
        with prometheus(config, work / "data", timeout=300, output="inherit") as server:
            waited = settle(server.url)
            blocks = own_metric(server.url, "prometheus_tsdb_blocks_loaded")
            compactions = own_metric(server.url, "prometheus_tsdb_compactions_total")
            print(f"prometheus: {blocks:.0f} blocks after {compactions:.0f} compactions (settled in {waited:.0f}s)",
                  flush=True)
            runs = time_reports(work, server.url, args.days, end)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    results.record("report_bench", {"nodes": args.nodes, "days": args.days, "samples": samples,
                                    "written and imported (s)": round(written), "compaction settled (s)": round(waited),
                                    "blocks": blocks}, {"report runs": runs}, path=args.results)
    return max(int(row[1] or 0) for row in runs.rows)


if __name__ == "__main__":
    sys.exit(main())
