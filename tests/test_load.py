"""200 concurrent scrapers against the exporter process: every scrape is answered, whole, and none is refused.

A functional test: it asserts what a scraper sees, counted by scrapes, not how fast. Latency, memory
and thread growth under the same load are benchmark figures (bench/exporter_bench.py --load-scrapers).
"""

import asyncio

import aiohttp
import pytest

from gpufleet.devtools import programs
from gpufleet.exporter.node import COLLECTORS

from helpers import parse

SCRAPERS = 200
SCRAPES_EACH = 10
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture
def exporter():
    with programs.exporter(f"--web.max-requests={SCRAPERS}", f"--web.max-connections={SCRAPERS}", gpus=8) as server:
        yield f"{server.url}/metrics"


async def scrape_concurrently(url: str) -> list[tuple[int, bytes]]:
    connector = aiohttp.TCPConnector(limit=SCRAPERS)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"Accept-Encoding": "gzip"}) as session:

        async def scraper() -> list[tuple[int, bytes]]:
            answers = []
            for _ in range(SCRAPES_EACH):
                async with session.get(url) as response:
                    answers.append((response.status, await response.read()))
            return answers

        return [answer for answers in await asyncio.gather(*(scraper() for _ in range(SCRAPERS)))
                for answer in answers]


def test_two_hundred_concurrent_scrapers_are_each_answered_in_full(exporter):
    answers = asyncio.run(scrape_concurrently(exporter))
    assert len(answers) == SCRAPERS * SCRAPES_EACH
    assert {status for status, _ in answers} == {200}
    for body in {body for _, body in answers}:  # Each distinct body once: the exposition changes per collection.
        samples = parse(body)  # Whole: it parses, with every collector's success series in it.
        assert {dict(labels)["collector"] for name, labels in samples
                if name == "gpufleet_collector_success"} == {collector.name for collector in COLLECTORS}
