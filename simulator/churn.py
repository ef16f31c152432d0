"""Jobs that end and give way to others, so that nodes join and leave jobs as on a real cluster.

Each job of the layout is a slot of nodes. With churn, the slot's job runs for a lifetime drawn around
the mean, its nodes idle for a short gap (the scheduler draining and starting the next), and a new job
with its own id starts on most of the slot's nodes: between three quarters and all of them, so some nodes
sit out a job and rejoin a later one. Everything is drawn from the seed and is a function of time,
computed as far as the fleet has run, so every node agrees on who runs what.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpufleet.exporter.gpu.simulated.host import random_uuid
from gpufleet.simulator.layout import Job


@dataclass(frozen=True)
class Tenure:
    start: float
    end: float
    job: Job


class _Slot:
    """The jobs one slot of nodes runs, one after another."""

    def __init__(self, first: Job, lifetime: float, rng: random.Random) -> None:
        self.first = first
        self.lifetime = lifetime
        self.rng = rng
        # The layout's job is already part way through its life when the fleet starts.
        self.tenures = [Tenure(0.0, rng.uniform(0.1, 1.5) * lifetime, first)]

    def at(self, t: float) -> Job | None:
        while self.tenures[-1].end <= t:
            self._next()
        position = bisect.bisect_right(self.tenures, t, key=lambda tenure: tenure.start) - 1
        if position < 0:
            return None
        tenure = self.tenures[position]
        return tenure.job if t < tenure.end else None  # In the gap after it, the slot's nodes idle.

    def _next(self) -> None:
        rng, first = self.rng, self.first
        start = self.tenures[-1].end + rng.uniform(0.05, 0.15) * self.lifetime
        size = rng.randint(math.ceil(0.75 * len(first.nodes)), len(first.nodes))
        number = len(self.tenures)
        job_id = random_uuid(rng) if first.scheduler == "kubernetes" else f"{first.id}{number:03d}"
        job = replace(first, id=job_id, nodes=tuple(sorted(rng.sample(first.nodes, size))),
                      period=first.period * rng.uniform(0.9, 1.1), started=start)
        self.tenures.append(Tenure(start, start + rng.uniform(0.5, 1.5) * self.lifetime, job))


class Churn:
    """Who runs what at any time, for a fleet whose jobs last `lifetime` seconds on average."""

    def __init__(self, jobs: Sequence[Job], lifetime: float, seed: int) -> None:
        self._slots = [_Slot(job, lifetime, random.Random(f"churn:{seed}:{job.id}")) for job in jobs]
        self._by_node = {node: slot for slot in self._slots for node in slot.first.nodes}

    def job_at(self, node: str, t: float) -> Job | None:
        slot = self._by_node.get(node)
        job = slot.at(t) if slot is not None else None
        return job if job is not None and node in job.nodes else None

    def jobs_at(self, t: float) -> list[Job]:
        return [job for slot in self._slots if (job := slot.at(t)) is not None]
