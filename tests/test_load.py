"""200 concurrent scrapers for 30 s against the exporter with 8 simulated GPUs: no errors, no growth.

This is a test, not a benchmark: it asserts that nothing fails and nothing grows, and prints the
latency it saw for the README's table. Every loop is bounded by time and the exporter listens on
127.0.0.1 only.
"""

import asyncio
import socket
import statistics
import subprocess
import sys
import time

import aiohttp
import psutil
import pytest
from helpers import FIXTURE_SYSFS, free_port, stop_process

SCRAPERS = 200
SECONDS = 30.0


@pytest.fixture
def exporter():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "exporter", "--gpu.backend=sim", "--sim.gpus=8",
         f"--path.sysfs={FIXTURE_SYSFS}", f"--web.listen-address=127.0.0.1:{port}",
         f"--web.max-requests={SCRAPERS + 50}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert process.poll() is None and time.monotonic() < deadline, "exporter did not start"
        time.sleep(0.1)
    yield process, f"http://127.0.0.1:{port}/metrics"
    stop_process(process)


async def hammer(url: str, seconds: float) -> tuple[list[float], dict[int, int], int]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    failures = 0
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=SCRAPERS)
    async with aiohttp.ClientSession(connector=connector, headers={"Accept-Encoding": "gzip"}) as session:

        async def scraper() -> None:
            nonlocal failures
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
                        await response.read()
                        statuses[response.status] = statuses.get(response.status, 0) + 1
                except (TimeoutError, aiohttp.ClientError):
                    failures += 1
                    continue
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(scraper() for _ in range(SCRAPERS)))
    return latencies, statuses, failures


def test_two_hundred_concurrent_scrapers_for_thirty_seconds(exporter):
    process, url = exporter
    asyncio.run(hammer(url, 3.0))  # Warm up: every collector has run, caches are built.
    watched = psutil.Process(process.pid)
    rss_before, threads_before = watched.memory_info().rss, watched.num_threads()
    latencies, statuses, failures = asyncio.run(hammer(url, SECONDS))
    time.sleep(1)
    rss_after, threads_after = watched.memory_info().rss, watched.num_threads()
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000
    print(f"\nload: {len(latencies)} scrapes by {SCRAPERS} scrapers in {SECONDS:g}s, p50 "
          f"{statistics.median(latencies) * 1000:.1f} ms, p99 {p99:.1f} ms, RSS {rss_before / 2**20:.1f} -> "
          f"{rss_after / 2**20:.1f} MiB, threads {threads_before} -> {threads_after}")
    assert failures == 0 and set(statuses) == {200}, (failures, statuses)
    assert len(latencies) > SCRAPERS * 10
    assert rss_after - rss_before < 16 * 2**20
    assert threads_after <= threads_before + 2  # At most a collection thread or two in flight.
