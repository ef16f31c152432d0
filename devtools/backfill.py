"""Simulated history imported into a real Prometheus, and the committed rule groups evaluated over it with
promtool, as the report tests and the report benchmarks need them."""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from gpufleet.alerts.cli import RULES_FILE
from gpufleet.devtools.programs import binary, prometheus
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.history import History, write_openmetrics

DAY = 86400


def backfill(tmp: Path, fleet: Fleet, start: float, end: float, step: float, metrics: re.Pattern[str],
             hold: float = 0.0) -> tuple[Path, int]:
    """The fleet's history, every `step` from `start` to `end`, imported into `tmp/data` in day-long blocks,
    a day at a time (a month of hundreds of nodes does not fit in memory at once); and how many node
    collections it took (see `History` for `hold`)."""
    past = History(fleet, start, metrics, {"cluster": "test"}, hold)
    data, dump = tmp / "data", tmp / "history.om"
    fleet.start()
    try:
        day = start
        while day <= end:  # Cut at UTC midnight, where promtool's day-long blocks end.
            last = min(end, day + ((day // DAY + 1) * DAY - day - 1) // step * step)
            families = asyncio.run(past.samples(day, last, step))
            day = last + step
            with dump.open("w") as out:
                write_openmetrics(families, out)
            subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                            "--max-block-duration=24h", str(dump), str(data)], check=True, capture_output=True,
                           timeout=600)
    finally:
        for node in fleet.nodes.values():
            node.close()
    dump.unlink()
    return data, past.collections


def _config(tmp: Path) -> Path:
    path = tmp / "prometheus.yml"
    path.write_text("global:\n  scrape_interval: 1m\n")  # Nothing to scrape: the data is all imported.
    return path


@contextmanager
def recorded(tmp: Path, data: Path, start: float, end: float, groups: tuple[str, ...],
             records: frozenset[str] | None = None, web_config: Path | None = None) -> Iterator[str]:
    """Prometheus on `data` after the committed rule `groups` (only their `records`, where given) were
    evaluated from `start` to `end` into it, each at its own interval, as Prometheus would have recorded them."""
    committed = yaml.safe_load(RULES_FILE.read_text())["groups"]
    kept = [{**g, "rules": [r for r in g["rules"] if records is None or r["record"] in records]}
            for g in committed if g["name"] in groups]
    rules = tmp / "report-rules.yml"
    rules.write_text(yaml.safe_dump({"groups": kept}))
    blocks = tmp / "recorded"
    with prometheus(_config(tmp), data) as server:
        # Day-long blocks: in promtool's default of 2 hours, a month of a dozen rules is thousands of blocks,
        # minutes to write and to open; much longer ones lose the samples before the last block's start.
        subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "rules", f"--url={server.url}",
                        f"--start={int(start)}", f"--end={int(end) + 1}", f"--output-dir={blocks}",
                        "--max-block-duration=24h", str(rules)], check=True, capture_output=True, timeout=600)
    for block in blocks.iterdir():
        block.rename(data / block.name)
    with prometheus(_config(tmp), data, web_config=web_config) as server:
        yield server.url
