"""Past weeks of a simulated fleet as OpenMetrics, for `promtool tsdb create-blocks-from openmetrics`.

Capacity and reliability reports read weeks of history, and a test cannot wait weeks. The simulator's
clock is only a number, so each node is collected at every past step as fast as the collectors run,
and the samples are written with their timestamps, labelled as Prometheus would have labelled them
when scraping (`cluster`, `instance`, `job`, and `up`, which is 0 while a node's exporter is down).

OpenMetrics wants each family's samples together, so samples are kept per family until the end of a
call; `metrics` keeps that to the families a report needs, and a month is written a call per day.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import TextIO

from gpufleet.simulator.faults import FaultKind
from gpufleet.simulator.fleet import Fleet, Node

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
# Steps a node is still collected after one of its faults ends: an XID reaches the exposition through
# the watcher's thread, and a counter's last increase should be written before the node is held.
_SETTLE_STEPS = 3


def _labelled(labels: str | None, target: str) -> str:
    inner = (labels or "{}")[1:-1]
    return "{" + target + ("," + inner if inner else "") + "}"


class History:
    """One fleet's past, written forward in time across calls: each node's counters and XID ledger go on
    from where the last call left them.

    `hold` (seconds) trades exactness for speed at fleet sizes a test cannot afford to collect at every
    step (a 2,048-GPU month is 2.3 million collections): a node none of whose faults is active, or ended
    in the last few steps, repeats its last collected values for up to `hold` seconds. It is exact only for
    families that change with faults alone, as the simulator's GPU, XID, ECC and remap state, clock events
    and InfiniBand state do (what the reliability report reads); utilisation, power and traffic vary
    with the workload, so the capacity report's history is collected at every step (`hold` 0).
    """

    def __init__(self, fleet: Fleet, origin: float, metrics: re.Pattern[str], labels: dict[str, str],
                 hold: float = 0.0, names: Sequence[str] | None = None) -> None:
        self.fleet = fleet
        self.names = list(fleet.nodes) if names is None else list(names)  # The nodes it writes.
        self.origin = origin  # The epoch second that is the fleet's time 0.
        self.metrics = metrics
        self.labels = labels
        self.hold = hold
        self.collections = 0
        self._wall = itertools.count(0, 10**6).__next__  # Each pass is "long after" the last: every collector is due.
        self._held: dict[str, tuple[float, list[tuple[str, str]]]] = {}  # node -> (collected at, (family, series))

    def _due(self, node: Node, t: float, step: float) -> bool:
        held = self._held.get(node.name)
        if held is None or t - held[0] >= self.hold:
            return True
        settled = t - _SETTLE_STEPS * step
        return any(f.start <= t and (f.end is None or f.end > settled) for f in self.fleet.faults_for(node.name))

    async def _collect(self, node: Node, t: float, target: str) -> list[tuple[str, str]]:
        body = (await node.scrape(t, self._wall)).decode()
        self.collections += 1
        series = []
        for line in body.splitlines():
            match = _SAMPLE.match(line)
            if match is not None and self.metrics.fullmatch(match[1]):
                series.append((match[1], f"{match[1]}{_labelled(match[2], target)} {match[3]}"))
        self._held[node.name] = (t, series)
        return series

    async def samples(self, start: float, end: float, step: float) -> dict[str, list[str]]:
        """OpenMetrics sample lines per family, for every node at start, start + step, ... up to end (epoch s).

        XID events reach the exporter's ledger through each node's watcher thread: start the fleet first
        (`fleet.start()`) where the history should hold them, and close its nodes afterwards.
        """
        families: dict[str, list[str]] = {"up": []}
        steps = int((end - start) // step) + 1
        for index in range(steps):
            t = start - self.origin + index * step
            stamp = f"{start + index * step:.3f}"
            for name in self.names:
                node = self.fleet.nodes[name]
                target = ",".join(f'{k}="{v}"' for k, v in {**self.labels, "instance": name, "job": "gpufleet"}.items())
                if node.has_at(FaultKind.EXPORTER_DOWN, t) or node.state.restarting_at(t):
                    # As Prometheus records a target that does not answer: up 0, nothing else.
                    families["up"].append(f"up{{{target}}} 0 {stamp}")
                    self._held.pop(name, None)  # It comes back with what it collects then.
                    continue
                families["up"].append(f"up{{{target}}} 1 {stamp}")
                series = await self._collect(node, t, target) if self._due(node, t, step) else self._held[name][1]
                for family, line in series:
                    families.setdefault(family, []).append(f"{line} {stamp}")
        return families


def write_openmetrics(families: dict[str, list[str]], out: TextIO) -> None:
    """Every family typed `unknown`: the import keeps samples, and names need no `_total` rewriting."""
    for name, lines in families.items():
        out.write(f"# TYPE {name} unknown\n")
        out.writelines(line + "\n" for line in lines)
    out.write("# EOF\n")
