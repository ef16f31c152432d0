"""Benchmark of `gpufleet exporter` against Debian's prometheus-node-exporter on the same sysfs tree.

Usage: .venv/bin/python bench/exporter_bench.py [--cpu-seconds 60] [--load-scrapers 200] [--load-seconds 30]
                                                [--gpm-rounds 5]

It builds a node-sized sysfs tree (8 InfiniBand ports, 4 Ethernet interfaces,
32 hwmon sensors), starts the exporter with 8 simulated GPUs on it and
node_exporter with the matching collectors (netclass, infiniband, hwmon,
thermal_zone) and no cap on parallel scrapes, and prints:

* the machine: CPUs, architecture and page size, the interpreter and the memory settings it inherits,
  and whether aiohttp and multidict run their C extensions;
* the series count, in all and by metric family;
* scrape latency p50/p99 with 1 and with 50 concurrent scrapers, for both
  exporters, asking for gzip as Prometheus does;
* the exporter's CPU use as a share of one core over --cpu-seconds at its
  default intervals, scraped every 15 s as a Prometheus would, and node_exporter's
  over the same window, so that a slow machine can be told from a slow exporter;
* sustained load: --load-scrapers scraping without pause for --load-seconds,
  with the scrapes answered, failed and refused, latency p50/p99, and the
  exporter's resident memory and threads before and after;
* the exporter's resident memory after each phase (and how much of it is anonymous memory, the heap,
  and how much mapped files, the interpreter and its libraries) and its peak (VmHWM), and
  node_exporter's peak beside it;
* what GPM adds to one 8-GPU collection: the GPU collector timed in this process
  over the simulated library, with and without GPM, alternating, best of
  --gpm-rounds rounds of 50 collections each;
* the install a GPU node gets (unless --no-install): the checkout installed into a fresh virtual environment
  as `pip install .` and as `pip install '.[all]'`, each environment's size on disk, and in the lean one the
  exporter's import time and its resident memory once it answers, before any scrape.

Everything listens on 127.0.0.1 only; every loop is bounded by a count.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import aiohttp.http_parser
import multidict
import psutil

from gpufleet.devtools import results
from gpufleet.devtools.net import free_port, get
from gpufleet.devtools.nodes import series_by_family, write_bench_sysfs
from gpufleet.devtools.paths import FIXTURE_SYSFS, ROOT
from gpufleet.devtools.processes import Server, serving
from gpufleet.devtools.programs import binary, exporter, node_exporter
from gpufleet.devtools.resources import cpu_seconds, disk_bytes, peak_rss_mib, status_mib
from gpufleet.devtools.stats import percentile
from gpufleet.devtools.waiting import HarnessError
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.gpm import metric_set
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml

SINGLE_REQUESTS = 2000
CONCURRENT_SCRAPERS = 50
REQUESTS_PER_SCRAPER = 100


async def latencies(url: str, scrapers: int, requests_each: int) -> list[float]:
    results: list[float] = []
    connector = aiohttp.TCPConnector(limit=scrapers)
    async with aiohttp.ClientSession(connector=connector, headers={"Accept-Encoding": "gzip"}) as session:

        async def scraper() -> None:
            for _ in range(requests_each):
                started = time.perf_counter()
                async with session.get(url) as response:
                    await response.read()
                    if response.status != 200:
                        raise HarnessError(f"{url} answered {response.status}")
                results.append(time.perf_counter() - started)

        await asyncio.gather(*(scraper() for _ in range(scrapers)))
    return results


def latency_row(name: str, url: str) -> dict[str, float]:
    asyncio.run(latencies(url, 1, 50))  # Warm up connections and caches.
    single = asyncio.run(latencies(url, 1, SINGLE_REQUESTS))
    many = asyncio.run(latencies(url, CONCURRENT_SCRAPERS, REQUESTS_PER_SCRAPER))
    row = {
        "p50_1": percentile(single, 0.5) * 1000, "p99_1": percentile(single, 0.99) * 1000,
        "p50_50": percentile(many, 0.5) * 1000, "p99_50": percentile(many, 0.99) * 1000,
    }
    print(f"{name:<16} {row['p50_1']:>9.2f} {row['p99_1']:>9.2f} {row['p50_50']:>10.2f} {row['p99_50']:>10.2f}")
    return row


async def sustained(url: str, scrapers: int, seconds: float) -> tuple[list[float], dict[int, int], int]:
    """Latencies, statuses and failures of `scrapers` scraping without pause for `seconds`."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    failures = 0
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=scrapers)
    async with aiohttp.ClientSession(connector=connector, headers={"Accept-Encoding": "gzip"}) as session:

        async def scraper() -> None:
            nonlocal failures
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
                        await response.read()
                        statuses[response.status] = statuses.get(response.status, 0) + 1
                except (aiohttp.ClientError, TimeoutError):
                    failures += 1
                    continue
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(scraper() for _ in range(scrapers)))
    return latencies, statuses, failures


def load_row(pid: int, url: str, scrapers: int, seconds: float) -> dict[str, results.Value]:
    asyncio.run(sustained(url, scrapers, 3.0))  # Warm up: every collector has run, caches are built.
    process = psutil.Process(pid)
    rss_before, mib_before, threads_before = resident(pid), status_mib(pid)["VmRSS"], process.num_threads()
    scraped, statuses, failures = asyncio.run(sustained(url, scrapers, seconds))
    rss_after, mib_after, threads_after = resident(pid), status_mib(pid)["VmRSS"], process.num_threads()
    print(f"load: {scrapers} scrapers for {seconds:g}s: {len(scraped)} scrapes, statuses {statuses}, "
          f"{failures} failed; p50 {percentile(scraped, 0.5) * 1000:.1f} ms, "
          f"p99 {percentile(scraped, 0.99) * 1000:.1f} ms; RSS {rss_before} -> {rss_after}; "
          f"threads {threads_before} -> {threads_after}")
    return {"load scrapes": len(scraped), "load scrapes not 200": len(scraped) - statuses.get(200, 0),
            "load failures": failures, "load p50 (ms)": percentile(scraped, 0.5) * 1000,
            "load p99 (ms)": percentile(scraped, 0.99) * 1000, "load RSS before (MiB)": mib_before,
            "load RSS after (MiB)": mib_after, "load threads before": threads_before,
            "load threads after": threads_after}


def resident(pid: int) -> str:
    """Resident memory, and how much of it is the process's own (anonymous: Python's heap) and how much is
    mapped files (the interpreter and its libraries), which tells a grown heap from a larger install."""
    fields = status_mib(pid)
    return f"{fields['VmRSS']:.1f} MiB (anon {fields['RssAnon']:.1f}, file {fields['RssFile']:.1f})"


def platform_summary() -> str:
    """What differs between machines and moves an exporter's memory and CPU: the page size (64 KiB pages
    round every touched allocation up), the interpreter and the settings it inherits (development mode, which
    brings PYTHONMALLOC=debug, added 6 MiB here and tripled the scrape latency), and whether aiohttp and
    multidict run their C extensions or their pure-Python fallbacks (wheels missing for this Python or
    architecture)."""
    parser = "C" if aiohttp.http_parser.HttpRequestParser.__module__.endswith("_http_parser") else "Python"
    mapping = "C" if multidict.MultiDict.__module__.endswith("_multidict") else "Python"
    settings = [f"{name}={os.environ[name]}" for name in ("PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONTRACEMALLOC",
                                                          "MALLOC_ARENA_MAX") if name in os.environ]
    return (f"{platform.machine()}, {os.sysconf('SC_PAGE_SIZE') // 1024} KiB pages, "
            f"{platform.python_implementation()} {platform.python_version()} ({sys.executable}"
            f"{', ' + ', '.join(settings) if settings else ''}), aiohttp {aiohttp.__version__} with its {parser} "
            f"HTTP parser, multidict {multidict.__version__} ({mapping})")


def cpu_shares(targets: dict[int, str], seconds: float) -> dict[int, float]:
    """CPU of each process (pid -> its /metrics URL) over the same `seconds`, each scraped every 15 s like a
    Prometheus would."""
    processes = {pid: psutil.Process(pid) for pid in targets}
    before = {pid: cpu_seconds(process) for pid, process in processes.items()}
    started = time.monotonic()
    for _ in range(int(seconds // 15) + 1):
        for url in targets.values():
            get(url, timeout=2)
        remaining = started + seconds - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(15.0, remaining))
    elapsed = time.monotonic() - started
    return {pid: (cpu_seconds(process) - before[pid]) / elapsed for pid, process in processes.items()}


def gpm_cost(rounds: int) -> tuple[float, float]:
    """Milliseconds per 8-GPU collection without and with GPM (best round of each, run alternately).

    The simulated library is Python, so this counts its side of GPM too; on a real board those calls are the
    driver's C code instead.
    """
    best = {False: float("inf"), True: float("inf")}
    for _ in range(rounds):
        for with_gpm in (False, True):
            now = [1000.0]

            def clock(now: list[float] = now) -> float:
                return now[0]

            nvml = SimulatedNvml(simulated_gpus(8), clock=clock)
            session = NvmlSession(nvml, clock=clock, gpm=metric_set(detail=False) if with_gpm else ())
            collector = GpuCollector(session)
            collector.collect()  # Open the GPUs, and take GPM's first sample.
            started = time.perf_counter()
            for _ in range(50):
                now[0] += 5.0
                collector.collect()
            best[with_gpm] = min(best[with_gpm], (time.perf_counter() - started) / 50 * 1000)
            collector.close()
    return best[False], best[True]


def compare(ours: Server, theirs: Server, cpu_window: float) -> dict[str, results.Value]:
    """Series, latency, CPU and memory of both exporters, phase by phase."""
    ours_url, theirs_url = f"{ours.url}/metrics", f"{theirs.url}/metrics"
    time.sleep(6)  # Two GPU collections (every 5 s): GPM's series span two, so they come with the second.
    phases = [("started", resident(ours.pid), status_mib(ours.pid)["VmRSS"])]
    body = get(ours_url)
    families = series_by_family(body.decode())
    print(f"machine: {os.cpu_count()} CPUs, {platform_summary()}")
    print(f"gpufleet /metrics: {len(body)} bytes, {sum(families.values())} series")
    print("series by family: " + ", ".join(f"{name} {count}" for name, count in families.most_common()))
    print(f"{'scrape latency':<16} {'p50 1 ms':>9} {'p99 1 ms':>9} {'p50 50 ms':>10} {'p99 50 ms':>10}")
    ours_row = latency_row("gpufleet", ours_url)
    phases.append(("1 and 50 scrapers", resident(ours.pid), status_mib(ours.pid)["VmRSS"]))
    theirs_row = latency_row("node_exporter", theirs_url)
    print(f"p99 at 50 scrapers, gpufleet / node_exporter: {ours_row['p99_50'] / theirs_row['p99_50']:.2f}")
    shares = cpu_shares({ours.pid: ours_url, theirs.pid: theirs_url}, cpu_window)
    phases.append((f"{cpu_window:g}s at default intervals", resident(ours.pid), status_mib(ours.pid)["VmRSS"]))
    print(f"CPU over {cpu_window:g}s, scraped every 15 s: gpufleet (default intervals) "
          f"{shares[ours.pid] * 100:.2f}%, node_exporter {shares[theirs.pid] * 100:.2f}% of one core")
    print("gpufleet RSS after each phase: " + ", ".join(f"{name} {rss}" for name, rss, _ in phases))
    peaks = peak_rss_mib(ours.pid), peak_rss_mib(theirs.pid)
    print(f"peak RSS (VmHWM): gpufleet {peaks[0]:.1f} MiB, node_exporter {peaks[1]:.1f} MiB")
    return {"series": sum(families.values()), "bytes": len(body),
            **{f"gpufleet {key} (ms)": value for key, value in ours_row.items()},
            **{f"node_exporter {key} (ms)": value for key, value in theirs_row.items()},
            "gpufleet CPU (share of a core)": shares[ours.pid],
            "node_exporter CPU (share of a core)": shares[theirs.pid],
            **{f"gpufleet RSS after {name} (MiB)": mib for name, _, mib in phases},
            "gpufleet peak RSS (MiB)": peaks[0], "node_exporter peak RSS (MiB)": peaks[1]}


def install_figures() -> dict[str, float]:
    """The lean and the full install's size on disk, and the lean exporter's import time and first memory."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, target in (("lean", str(ROOT)), ("all", f"{ROOT}[all]")):
            venv = Path(tmp) / name
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", target], check=True, timeout=900)
            figures[f"installed size, {name} (MiB)"] = round(disk_bytes(venv) / 2**20, 1)
            print(f"installed size, pip install {'.' if name == 'lean' else '.[all]'}: "
                  f"{figures[f'installed size, {name} (MiB)']:.1f} MiB")
        python = str(Path(tmp) / "lean" / "bin" / "python")
        imports = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([python, "-c", "import gpufleet.exporter.cli"], check=True, timeout=60, cwd=tmp)
            imports.append(time.perf_counter() - started)
        figures["lean exporter import, best of 3 (s)"] = round(min(imports), 3)
        port = free_port()
        argv = [python, "-m", "gpufleet", "exporter", "--gpu.backend=sim", f"--path.sysfs={FIXTURE_SYSFS}",
                f"--web.listen-address=127.0.0.1:{port}"]
        with serving(argv, port, "/healthz", "lean exporter start", timeout=60) as server:
            figures["lean exporter RSS before the first scrape (MiB)"] = round(status_mib(server.pid)["VmRSS"], 1)
    print(f"lean exporter: import {figures['lean exporter import, best of 3 (s)']:.3f} s, RSS before the first "
          f"scrape {figures['lean exporter RSS before the first scrape (MiB)']:.1f} MiB")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    parser.add_argument("--load-scrapers", type=int, default=200)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    parser.add_argument("--gpm-rounds", type=int, default=5)
    parser.add_argument("--install", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the lean and full installs in fresh virtual environments (needs pip's index)")
    results.add_argument(parser)
    args = parser.parse_args()
    # The comparison is what tells a slow machine from a slow exporter: without it the figures mislead.
    binary("prometheus-node-exporter")
    without, with_gpm = gpm_cost(args.gpm_rounds)
    print(f"GPU collection of 8 simulated GPUs: {without:.2f} ms without GPM, {with_gpm:.2f} ms with it "
          f"(+{with_gpm - without:.2f} ms)")
    # Room for the latency phase's scrapers as well as the load phase's, whichever is larger.
    connections = max(args.load_scrapers, CONCURRENT_SCRAPERS)
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = Path(tmp) / "sys"
        write_bench_sysfs(sysfs)
        # node_exporter with the matching collectors; its default of 40 requests answers 503 to 50 scrapers.
        with (exporter("--log.level=warn", f"--web.max-requests={connections}",
                       f"--web.max-connections={connections}", gpus=8, sysfs=sysfs, output="inherit") as ours,
              node_exporter(sysfs, "--collector.disable-defaults", "--collector.netclass", "--collector.infiniband",
                            "--collector.hwmon", "--collector.thermal_zone", "--web.max-requests=0",
                            "--log.level=warn", output="discard") as theirs):
            figures = compare(ours, theirs, args.cpu_seconds)
            figures |= load_row(ours.pid, f"{ours.url}/metrics", args.load_scrapers, args.load_seconds)
    figures |= {"GPU collection without GPM (ms)": without, "GPU collection with GPM (ms)": with_gpm}
    if args.install:
        figures |= install_figures()
    results.record("exporter_bench", figures, notes=platform_summary(), path=args.results)


if __name__ == "__main__":
    main()
