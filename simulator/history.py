"""Past weeks of a simulated fleet as OpenMetrics, for `promtool tsdb create-blocks-from openmetrics`.

Capacity reports read weeks of history, and a test cannot wait weeks. The simulator's clock is
only a number, so each node is collected at every past step as fast as the collectors run, and
the samples are written with their timestamps, labelled as Prometheus would have labelled them
when scraping (`cluster`, `instance`, `job`, and `up`, which is 0 while a node's exporter is down).

OpenMetrics wants each family's samples together, so samples are kept per family until the end;
`metrics` keeps that to the families a report needs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import TextIO

from gpufleet.simulator.fleet import Fleet

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def _labelled(labels: str | None, target: str) -> str:
    inner = (labels or "{}")[1:-1]
    return "{" + target + ("," + inner if inner else "") + "}"


async def history(fleet: Fleet, start: float, end: float, step: float, metrics: re.Pattern[str],
                  labels: dict[str, str], progress: Callable[[int, int], None] | None = None) -> dict[str, list[str]]:
    """OpenMetrics sample lines per family, for every node at start, start + step, ... up to end (epoch s).

    XID events reach the exporter's ledger through each node's watcher thread: start the fleet first
    (`fleet.start()`) where the history should hold them, and close its nodes afterwards.
    """
    families: dict[str, list[str]] = {"up": []}
    wall = itertools.count(0, 10**6).__next__  # Each pass is "long after" the last: every collector is due.
    steps = int((end - start) // step) + 1
    for index in range(steps):
        t = index * step
        stamp = f"{start + t:.3f}"
        for name, node in fleet.nodes.items():
            target = ",".join(f'{k}="{v}"' for k, v in {**labels, "instance": name, "job": "gpufleet"}.items())
            if node.down_at(t):  # As Prometheus records a target that does not answer: up 0, nothing else.
                families["up"].append(f"up{{{target}}} 0 {stamp}")
                continue
            body = (await node.scrape(t, wall)).decode()
            families["up"].append(f"up{{{target}}} 1 {stamp}")
            for line in body.splitlines():
                match = _SAMPLE.match(line)
                if match is None or not metrics.fullmatch(match[1]):
                    continue
                families.setdefault(match[1], []).append(f"{match[1]}{_labelled(match[2], target)} {match[3]} {stamp}")
        if progress is not None:
            progress(index + 1, steps)
    return families


def write_openmetrics(families: dict[str, list[str]], out: TextIO) -> None:
    """Every family typed `unknown`: the import keeps samples, and names need no `_total` rewriting."""
    for name, lines in families.items():
        out.write(f"# TYPE {name} unknown\n")
        out.writelines(line + "\n" for line in lines)
    out.write("# EOF\n")
