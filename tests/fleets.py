"""A small simulated fleet read through the exporter's collectors, for tests that measure what a fault or a
phase of the workload shows on /metrics."""

from __future__ import annotations

import itertools

from gpufleet.simulator.faults import parse_fault
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.layout import Job

from helpers import parse

NODES = tuple(f"gpu-node-000{i}" for i in range(1, 5))
JOB = Job("515151", "slurm", NODES, period=40.0, comm_fraction=0.3)
SLOW, PEER = NODES[0], NODES[1]
START = 1000.0  # Simulated seconds; every fault starts at 0.


class Probe:
    """A four-node fleet running JOB with the given faults, read through the exporter's collectors."""

    def __init__(self, *entries: dict) -> None:
        self.fleet = Fleet(node_count=4, gpus_per_node=8, seed=3, layout=[JOB])
        ids = itertools.count(1)
        self.fleet.add([parse_fault({"start": 0, **entry}, "test", f"t{next(ids)}", self.fleet.nodes, 8)
                        for entry in entries])
        self._wall = itertools.count(0, 100).__next__  # Every collector is due at every read.

    async def at(self, node: str, t: float) -> dict:
        return parse(await self.fleet.nodes[node].scrape(t, self._wall))

    async def per_second(self, node: str, name: str, span: float, **labels: str) -> float:
        before = value(await self.at(node, START), name, **labels)
        return (value(await self.at(node, START + span), name, **labels) - before) / span

    async def mean(self, node: str, name: str, step: float, **labels: str) -> float:
        """A gauge's mean per GPU over one training step of `step` seconds, read every half second: every
        phase here starts on a half second, so the mean is exact but for the noise."""
        instants = int(step * 2)
        total = 0.0
        for i in range(instants):
            total += value(await self.at(node, START + i / 2), name, **labels)
        return total / instants / 8

    async def sampled_mean(self, node: str, name: str, step: float, start: float = START) -> float:
        """A gauge the exporter averages over its collection interval (the driver's utilisation samples, or
        GPM): its mean per GPU over `step` seconds from `start`, read at their end."""
        await self.at(node, start)
        return value(await self.at(node, start + step), name) / 8

    def close(self) -> None:
        self.fleet.close()


def value(samples: dict, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, series), v in samples.items() if n == name and wanted <= series)
