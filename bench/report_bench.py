"""Benchmark of `gpufleet report capacity` over a long range on a large fleet, against a real Prometheus.

Usage: .venv/bin/python bench/report_bench.py [--nodes 100] [--days 30] [--keep DIR]

Writes synthetic history for N nodes of 8 GPUs (every series the report reads, a sample every
report step, 30 minutes for 30 days), imports it with `promtool tsdb create-blocks-from openmetrics`,
starts Debian's Prometheus on it (127.0.0.1), runs the report and prints how long each part took.

The simulator would take hours to produce a month of a large fleet, so the history is generated
directly: a fixed job layout, utilisation and power per job, counters that grow at a steady rate.
The report's cost is queries times series times points, and points are fixed by the step, so this
measures the query work. What it leaves out: a real Prometheus scraped every 15 s decodes about 120
samples per point, so dense data costs more per point than this does.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
PORTS = 8


def write_history(paths: list[Path], nodes: int, days: int, step: int, end: int) -> int:
    """OpenMetrics for the whole fleet, one file per day; returns the number of samples.

    promtool (2.42) reads its whole input once per 2-hour block it writes, so a month in one file
    costs 360 passes; a file per day costs 12.
    """
    rng = random.Random(0)
    stamps = [end - i * step for i in range(days * 86400 // step, -1, -1)]
    families: dict[str, list[tuple[str, list[float]]]] = {}

    def add(name: str, labels: str, values: list[float]) -> None:
        families.setdefault(name, []).append((labels, values))

    flat = lambda v: [v] * len(stamps)  # noqa: E731
    for n in range(1, nodes + 1):
        node = f'cluster="bench",instance="gpu-node-{n:04d}",job="gpufleet"'
        job = None if n % 7 == 0 else f"{(n - 1) // 4 + 1000}"  # One node in seven idle; jobs of four nodes.
        busy = rng.uniform(0.3, 0.98)
        add("gpufleet_gpu_devices", node, flat(GPUS))
        add("gpufleet_gpu_pci_devices", node, flat(GPUS))
        for g in range(GPUS):
            gpu = f'{node},gpu="{g}",uuid="GPU-{n:08d}-{g:04d}"'
            util = [min(1.0, max(0.0, busy + rng.gauss(0, 0.05))) if job else 0.0 for _ in stamps]
            power = [100 + 600 * u for u in util]
            add("gpufleet_gpu_info", f'{gpu},name="NVIDIA H100 80GB HBM3",driver_version="570.133.20"', flat(1))
            add("gpufleet_gpu_up", gpu, flat(1))
            if job:
                add("gpufleet_gpu_job_info", f'{gpu},scheduler="slurm",job_id="{job}"', flat(1))
            add("gpufleet_gpu_utilization_ratio", gpu, util)
            add("gpufleet_gpu_memory_total_bytes", gpu, flat(85520809984))
            add("gpufleet_gpu_memory_free_bytes", gpu, [85520809984 * (1 - 0.8 * u) for u in util])
            add("gpufleet_gpu_power_watts", gpu, power)
            add("gpufleet_gpu_power_limit_watts", gpu, flat(700))
            energy, total = [], 0.0
            for watts in power:
                total += watts * step
                energy.append(total)
            add("gpufleet_gpu_energy_joules_total", gpu, energy)
            add("gpufleet_gpu_clock_hertz", f'{gpu},clock="sm"', flat(1.98e9 if job else 3.45e8))
            add("gpufleet_gpu_ecc_errors_total", f'{gpu},error="uncorrected",scope="aggregate"', flat(0))
        for p in range(PORTS):
            port = f'{node},device="mlx5_{p}",port="1"'
            rate = 5e10 * (busy if job else 0.01)
            add("gpufleet_infiniband_rate_bytes_per_second", port, flat(5e10))
            for name in ("gpufleet_infiniband_port_xmit_data_bytes_total",
                         "gpufleet_infiniband_port_rcv_data_bytes_total"):
                add(name, port, [rate * step * i for i in range(len(stamps))])
    samples = 0
    for day, path in enumerate(paths):
        first, last = end - (days - day) * 86400, end - (days - day - 1) * 86400
        window = [i for i, t in enumerate(stamps) if first <= t < last or (t == end and day == days - 1)]
        with path.open("w") as out:
            for name, series in families.items():
                out.write(f"# TYPE {name} unknown\n")
                for labels, values in series:
                    out.writelines(f"{name}{{{labels}}} {values[i]:g} {stamps[i]}\n" for i in window)
                    samples += len(window)
            out.write("# EOF\n")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="keep the data and the report here")
    args = parser.parse_args()
    step = max(300, -(-args.days * 86400 // 1440 // 60) * 60)
    end = int(time.time()) // step * step - step
    work = Path(tempfile.mkdtemp(prefix="report-bench-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        files = [work / f"day-{day:02d}.om" for day in range(args.days)]
        samples = write_history(files, args.nodes, args.days, step, end)
        print(f"history: {args.nodes} nodes, {args.nodes * GPUS} GPUs, {args.days} days at {step}s, "
              f"{samples:,} samples, written in {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        for path in files:
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(work / "data")],
                           check=True, stdout=subprocess.DEVNULL)
            path.unlink()
        print(f"import: promtool tsdb create-blocks-from openmetrics in {time.monotonic() - started:.1f}s", flush=True)
        (work / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
        port = free_port()
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=90d", "--log.level=warn"])
        try:
            wait_ready(f"http://127.0.0.1:{port}/-/ready", prometheus, 120)
            started = time.monotonic()
            report = subprocess.run([str(ROOT / ".venv/bin/gpufleet"), "report", "capacity",
                                     f"--prometheus=http://127.0.0.1:{port}", f"--range={args.days}d",
                                     f"--end={end}", f"--out={work / 'report'}"], capture_output=True, text=True)
            took = time.monotonic() - started
            print(report.stderr.strip())
            print(f"report: exit {report.returncode} in {took:.1f}s wall")
            return report.returncode
        finally:
            prometheus.terminate()
            prometheus.wait(30)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
