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
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from support import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufleet.alerts import capacity as rec  # noqa: E402

INTERVAL = 300
GPUS = 8
PORTS = 8
NODES_PER_JOB = 4
MEMORY = 85520809984
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")


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


def write_day(out: TextIO, stamps: list[int], nodes: int, jobs: list[Job]) -> int:
    """Every recorded series at `stamps`, family by family; returns the number of samples."""
    model_of = [MODELS[0] if n < nodes // 2 else MODELS[1] for n in range(nodes)]
    running = [[j for j in jobs if j.start <= t < j.end] for t in stamps]
    lost = {(3, 5): (stamps[0], stamps[0] + 3 * 3600)}  # Node 3, GPU 5 off the bus for three hours a day.
    samples = 0

    def family(name: str, rows: list[tuple[str, list[float]]]) -> None:
        nonlocal samples
        out.write(f"# TYPE {name} unknown\n")
        for labels, values in rows:
            out.writelines(f"{name}{{{labels}}} {v:.4g} {t}\n" for t, v in zip(stamps, values, strict=True)
                           if v == v)
            samples += sum(1 for v in values if v == v)

    nan = float("nan")
    per_model: dict[str, list[list[float]]] = {}
    for model in MODELS:
        installed = [float(model_of.count(model) * GPUS)] * len(stamps)
        allocated = [sum(NODES_PER_JOB * GPUS for j in now if model_of[j.first] == model) for now in running]
        busy = [sum(NODES_PER_JOB * GPUS * j.busy for j in now if model_of[j.first] == model) for now in running]
        down = [sum(1 for (n, _), (a, b) in lost.items() if model_of[n] == model and a <= t < b) for t in stamps]
        per_model[model] = [installed, allocated, busy, down]
    model_rows = lambda pick: [(f'cluster="bench",name="{m}"', pick(*per_model[m])) for m in MODELS]  # noqa: E731

    states = {"installed": lambda i, a, b, d: i, "allocated": lambda i, a, b, d: a,
              "idle": lambda i, a, b, d: [x - y - z for x, y, z in zip(i, a, d, strict=True)],
              "lost": lambda i, a, b, d: [x or nan for x in d]}
    family(rec.GPUS, [(f'{labels},state="{state}"', values)
                      for state, pick in states.items() for labels, values in model_rows(pick)])
    family(rec.USED, model_rows(lambda i, a, b, d: b))
    family(rec.ALLOCATED_USED, model_rows(lambda i, a, b, d: b))
    out.write(f"# TYPE {rec.ALLOCATED_BUCKETS} unknown\n")
    for index, t in enumerate(stamps):
        for model in MODELS:
            counts: dict[float, int] = {}
            for j in running[index]:
                if model_of[j.first] == model:
                    bucket = int(rec.BUCKETS * j.busy) / rec.BUCKETS
                    counts[bucket] = counts.get(bucket, 0) + NODES_PER_JOB * GPUS
            out.writelines(f'{rec.ALLOCATED_BUCKETS}{{bucket="{b:g}",cluster="bench",name="{model}"}} {n} {t}\n'
                           for b, n in counts.items())
            samples += len(counts)
    family(rec.MEMORY_FREE, model_rows(lambda i, a, b, d: [MEMORY * (x - 0.8 * y) for x, y in zip(a, b, strict=True)]))
    family(rec.MEMORY_TOTAL, model_rows(lambda i, a, b, d: [MEMORY * x for x in a]))
    family(rec.MEMORY_TIGHT, model_rows(lambda i, a, b, d: [x * 0.1 for x in a]))
    family(rec.MEMORY_LOWEST, model_rows(lambda i, a, b, d: [0.05] * len(a)))
    power = lambda i, a, b, d: [100 * (x - z) + 600 * y for x, y, z in zip(i, b, d, strict=True)]  # noqa: E731
    family(rec.ENERGY, model_rows(power))
    family(rec.POWER, model_rows(power))
    family(rec.POWER_GPUS, model_rows(lambda i, a, b, d: [x - z for x, z in zip(i, d, strict=True)]))
    family(rec.POWER_OF_LIMIT, model_rows(lambda *m: [p / 700 for p in power(*m)]))
    family(rec.POWER_CAPPED, model_rows(lambda i, a, b, d: [x * 0.02 for x in a]))

    gpu = lambda n, g: f'cluster="bench",gpu="{g}",instance="gpu-node-{n + 1:04d}",name="{model_of[n]}"'  # noqa: E731
    family(rec.ECC, [(gpu(n, 1), [2.0] * len(stamps)) for n in range(0, nodes, 200)])
    family(rec.REMAP_PENDING, [(gpu(n, 2), [1.0 if i < 24 else nan for i in range(len(stamps))])
                               for n in range(100, nodes, 250)])
    family(rec.LOST, [(gpu(n, g), [1.0 if a <= t < b else nan for t in stamps]) for (n, g), (a, b) in lost.items()])
    slowed = [j for j in jobs if int(j.id) % 50 == 0 and j.start < stamps[-1] and j.end > stamps[0]]
    family(rec.STRAGGLING, [(f'cluster="bench",instance="gpu-node-{j.first + 2:04d}",job_id="{j.id}",scheduler="slurm"',
                             [0.6 if j.start + 3600 <= t < j.start + 7200 else nan for t in stamps]) for j in slowed])

    live = [j for j in jobs if j.start <= stamps[-1] and j.end > stamps[0]]
    job_labels = lambda j: f'cluster="bench",job_id="{j.id}",namespace="",pod="",scheduler="slurm"'  # noqa: E731
    within = lambda j, v: [v if j.start <= t < j.end else nan for t in stamps]  # noqa: E731
    family(rec.JOB_GPUS, [(job_labels(j), within(j, NODES_PER_JOB * GPUS)) for j in live])
    family(rec.JOB_NODES, [(job_labels(j), within(j, NODES_PER_JOB)) for j in live])
    family(rec.JOB_USED, [(job_labels(j), within(j, NODES_PER_JOB * GPUS * j.busy)) for j in live])

    out.write(f"# TYPE {rec.LINKS} unknown\n")
    busy_at = [[0.01] * nodes for _ in stamps]
    for index, now in enumerate(running):
        for j in now:
            for n in range(j.first, j.first + NODES_PER_JOB):
                busy_at[index][n] = j.busy
    for n in range(nodes):
        for p in range(PORTS):
            for direction in ("transmit", "receive"):
                labels = (f'class="infiniband",cluster="bench",device="mlx5_{p}",direction="{direction}",'
                          f'instance="gpu-node-{n + 1:04d}",job="gpufleet",port="1"')
                out.writelines(f"{rec.LINKS}{{{labels}}} {busy_at[i][n] * (0.9 + (i * 7 + p) % 11 / 100):.3g} {t}\n"
                               for i, t in enumerate(stamps))
                samples += len(stamps)
    out.write("# TYPE gpufleet_gpu_info unknown\n")
    for n in range(nodes):
        for g in range(GPUS):
            out.write(f'gpufleet_gpu_info{{{gpu(n, g)},job="gpufleet",uuid="GPU-{n:08d}-{g:04d}"}} 1 {stamps[-1]}\n')
    samples += nodes * GPUS
    out.write("# EOF\n")
    return samples


def prometheus_metric(url: str, name: str) -> float:
    """One of Prometheus's own metrics, from its /metrics page: nothing scrapes it into its TSDB here."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def settle(url: str, quiet: float = 90, limit: float = 1800) -> float:
    """Wait until Prometheus has compacted the imported blocks: no compaction and no block change for `quiet` s."""
    started = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - started < limit:
        now = (prometheus_metric(url, "prometheus_tsdb_compactions_total"),
               prometheus_metric(url, "prometheus_tsdb_blocks_loaded"))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        time.sleep(10)
    return time.monotonic() - started


def slowest(log: Path, count: int = 5) -> list[str]:
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    entries.sort(key=lambda e: -e["stats"]["timings"]["execTotalTime"])
    return [f"  {e['stats']['timings']['execTotalTime']:6.2f}s  {e['params']['query'][:100]}" for e in entries[:count]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="keep the data and the report here")
    args = parser.parse_args()
    end = int(time.time()) // 3600 * 3600 - 3600
    start = end - args.days * 86400
    work = Path(tempfile.mkdtemp(prefix="report-bench-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        jobs = plan(args.nodes, start, end)
        samples, importing = 0, None
        for day in range(args.days):  # One day written while promtool imports the one before.
            path = work / f"day-{day:02d}.om"
            first = start + day * 86400 + INTERVAL
            with path.open("w") as out:
                samples += write_day(out, list(range(first, first + 86400, INTERVAL)), args.nodes, jobs)
            if importing is not None and importing.wait() != 0:
                raise SystemExit("promtool failed")
            importing = subprocess.Popen(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                                          "--max-block-duration=24h", str(path), str(work / "data")],
                                         stdout=subprocess.DEVNULL)
            print(f"  day {day + 1}/{args.days} written, {samples:,} samples so far", flush=True)
        if importing is not None and importing.wait() != 0:
            raise SystemExit("promtool failed")
        for path in work.glob("day-*.om"):
            path.unlink()
        print(f"history: {args.nodes} nodes, {args.nodes * GPUS} GPUs, {len(jobs):,} jobs, {args.days} days of "
              f"recorded series every {INTERVAL}s, {samples:,} samples, written and imported in "
              f"{time.monotonic() - started:.0f}s", flush=True)
        config = f"global:\n  scrape_interval: 1m\n  query_log_file: {work / 'queries.log'}\n"
        (work / "prometheus.yml").write_text(config)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=400d", "--log.level=warn"])
        try:
            wait_ready(f"{url}/-/ready", prometheus, 300)
            waited = settle(url)
            print(f"prometheus: {prometheus_metric(url, 'prometheus_tsdb_blocks_loaded'):.0f} blocks after "
                  f"{prometheus_metric(url, 'prometheus_tsdb_compactions_total'):.0f} compactions "
                  f"(settled in {waited:.0f}s)", flush=True)
            code = 0
            for attempt in ("first", "second"):
                (work / "queries.log").write_text("")
                began = time.monotonic()
                report = subprocess.run([str(ROOT / ".venv/bin/gpufleet"), "report", "capacity", f"--prometheus={url}",
                                         f"--range={args.days}d", f"--end={end}", f"--out={work / 'report'}"],
                                        capture_output=True, text=True)
                print(f"report ({attempt} run): exit {report.returncode} in {time.monotonic() - began:.1f}s wall; "
                      f"{report.stderr.strip().splitlines()[-1]}", flush=True)
                print("\n".join(["slowest queries (Prometheus execution time):", *slowest(work / "queries.log")]))
                code = code or report.returncode
            return code
        finally:
            prometheus.terminate()
            prometheus.wait(30)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
