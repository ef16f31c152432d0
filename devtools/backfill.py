"""Simulated history imported into a real Prometheus, and the committed rule groups evaluated over it with
promtool, as the report tests and the report benchmarks need them."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
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
    and how many node collections it took (see `History` for `hold`).

    No node's history depends on another's, so the nodes are shared among forked processes, one per CPU, each
    writing its own blocks: the collections, not the import, are what take long.
    Prometheus reads the blocks of one day from several workers as one. The fleet must not be started yet:
    each worker starts and closes its own nodes."""
    data = tmp / "data"
    names = list(fleet.nodes)
    count = max(1, min(os.cpu_count() or 1, len(names)))
    pasts = [History(fleet, start, metrics, {"cluster": "test"}, hold, names[k::count]) for k in range(count)]
    if count == 1:
        return data, _write(tmp / "history.om", data, pasts[0], start, end, step)
    context = multiprocessing.get_context("fork")
    running = []
    for k, past in enumerate(pasts):
        receive, send = context.Pipe(duplex=False)
        worker = context.Process(target=_worker, args=(send, tmp / f"history-{k}.om", data, past, start, end, step),
                                 name=f"history-{k}", daemon=True)
        worker.start()
        send.close()
        running.append((worker, receive, past.names))
    collections = 0
    for worker, receive, share in running:
        worker.join(timeout=_WORKER_TIMEOUT)
        if worker.is_alive():
            worker.kill()
        if worker.exitcode != 0 or not receive.poll():
            raise RuntimeError(f"the history of {', '.join(share)} was not written (exit {worker.exitcode})")
        collections += receive.recv()
    return data, collections


# A month of a few nodes writes in minutes; a worker still running after this is stuck, not slow.
_WORKER_TIMEOUT = 3600.0


def _worker(send: Connection, dump: Path, data: Path, past: History, start: float, end: float,
            step: float) -> None:
    send.send(_write(dump, data, past, start, end, step))
    send.close()


def _write(dump: Path, data: Path, past: History, start: float, end: float, step: float) -> int:
    """`past`'s nodes from `start` to `end`, a day at a time (a month of hundreds of nodes does not fit in
    memory at once), imported into `data`; how many collections it took."""
    nodes = [past.fleet.nodes[name] for name in past.names]
    for node in nodes:
        node.start()
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
        for node in nodes:
            node.close()
    dump.unlink()
    return past.collections


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
