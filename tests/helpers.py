"""Helpers shared by the tests: exposition text parsed into comparable samples, waits inside an event loop, and the
configuration a docs page gives."""

from __future__ import annotations

import re
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools.paths import ROOT
from gpufleet.exporter.collector import Collection
from gpufleet.exporter.render import render

Sample = tuple[str, frozenset[tuple[str, str]]]


def parse(text: str | bytes) -> dict[Sample, float]:
    """Every sample as {(name, labels): value}; fails on a duplicate series, which Prometheus would reject."""
    if isinstance(text, bytes):
        text = text.decode()
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


def rendered(collection: Collection) -> dict[Sample, float]:
    """A collection as /metrics would show it."""
    return parse(render(collection.families))


def series(metric: str, /, **labels: str) -> Sample:
    return (metric, frozenset(labels.items()))


def named(samples: dict[Sample, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The series of one metric name, keyed by their labels."""
    return {labels: value for (sample_name, labels), value in samples.items() if sample_name == name}


def nvml_present() -> bool:
    """Whether this machine has a working NVIDIA driver (tests that assume none skip there)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


async def eventually(check, timeout: float = 5.0, interval: float = 0.02):
    """Await `check()` until it returns a truthy value, at most `timeout` seconds; returns that value."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def documented_yaml(page: str, heading: str) -> Any:
    """The first YAML block under `## heading` of docs/`page`: what the docs tell a site to use, as it is."""
    text = (ROOT / "docs" / page).read_text()
    found = re.search(rf"^## {re.escape(heading)}\n.*?```yaml\n(.*?)```", text, re.S | re.M)
    assert found, f"docs/{page} has no YAML block under '## {heading}'"
    return yaml.safe_load(found.group(1))
