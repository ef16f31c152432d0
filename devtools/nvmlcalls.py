"""The NVML calls a GPU collection makes, counted, and the CPU each takes in the collector's own order.

What a call costs a real board can depend on what the driver was asked just before, which a call timed alone in
a loop does not show. So calls are timed where the collector makes them, through a wrapper around the library,
and counted the same way over the simulated library here: counts times per-call CPU is the exporter's NVML
cost, and a change that adds a call shows in the counts before any GPU is at hand.

A collection is named for the dearest tier it reads (`exporter.gpu.probes.Tier`): `counter` where the counters
are due (the slow reads may be too), `slow` where only the slow reads are, `fast` otherwise. The first after the
GPUs open reads everything; what opening them costs, once, is kept apart as `open`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.gpm import GpmMetric
from gpufleet.exporter.gpu.session import NvmlSession

TIERS = ("fast", "slow", "counter")
# Calls whose arguments choose what the driver does: the argument at this position becomes part of the key.
_CHOOSING_ARGUMENT = {
    "nvmlDeviceGetClockInfo": 1,
    "nvmlDeviceGetMaxClockInfo": 1,
    "nvmlDeviceGetTemperatureThreshold": 1,
    "nvmlDeviceGetViolationStatus": 1,
    "nvmlDeviceGetFieldValues": 1,
}


def _field_ids(requested: Iterable[Any]) -> str:
    """The field ids of a field-value request, each once, in order: per-link scopes read the same counter."""
    ids = (item[0] if isinstance(item, tuple) else item for item in requested)
    return ",".join(str(i) for i in dict.fromkeys(ids))


def call_key(name: str, args: tuple[Any, ...]) -> str:
    """The name a call is counted and timed under: its function, and the argument that chooses its work."""
    position = _CHOOSING_ARGUMENT.get(name)
    if position is None or len(args) <= position:
        return name
    chosen = args[position]
    return f"{name}({_field_ids(chosen) if name == 'nvmlDeviceGetFieldValues' else chosen})"


@dataclass
class Tally:
    """One call's count and CPU, under one tier."""

    calls: int = 0
    cpu: float = 0.0  # Seconds of this thread's CPU inside the calls.


@dataclass
class CallLog:
    """An NVML library whose every `nvml*` call is counted and timed under the tier the caller names."""

    library: Any
    tier: str = "open"
    tallies: dict[str, dict[str, Tally]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(Tally)))

    def cpu(self) -> float:
        """Seconds of CPU inside the library's calls so far, in every tier."""
        return sum(tally.cpu for calls in self.tallies.values() for tally in calls.values())

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.library, name)
        if not name.startswith("nvml") or not callable(target):
            return target

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return target(*args, **kwargs)
            finally:
                tally = self.tallies[self.tier][call_key(name, args)]
                tally.calls += 1
                tally.cpu += time.thread_time() - started

        return timed


@dataclass(frozen=True)
class Collections:
    """What `rounds` collections of each tier called, per GPU and collection, with the CPU they took."""

    gpus: int  # The GPUs that opened.
    rounds: dict[str, int]  # Collections of each tier.
    tallies: Mapping[str, Mapping[str, Tally]]  # Tier to call to totals over the tier's collections.
    cpu: dict[str, float]  # Tier to seconds of CPU per collection, in and around NVML.
    wall: dict[str, list[float]]  # Tier to each collection's wall-clock seconds.

    def counts(self, tier: str) -> dict[str, float]:
        """Calls per GPU and collection of the tier."""
        per = self.gpus * self.rounds[tier]
        return {key: tally.calls / per for key, tally in sorted(self.tallies[tier].items())}

    def share(self, tier: str) -> float:
        """The share of collections that are of the tier, at the schedule they were made on."""
        return self.rounds[tier] / sum(self.rounds.values())

    def call_cpu(self, tier: str) -> dict[str, float]:
        """Seconds of CPU per call, where the collector made it."""
        return {key: tally.cpu / tally.calls for key, tally in sorted(self.tallies[tier].items()) if tally.calls}



def collect(library: Any, *, rounds: int, slow_every: int, counter_every: int, gpm: tuple[GpmMetric, ...],
            advance: Callable[[], None] = lambda: None) -> Collections:
    """Open the GPUs, then make `rounds` whole cycles of the schedule the exporter keeps at `slow_every` and
    `counter_every`; `advance` runs before each collection (a simulated clock's step)."""
    log = CallLog(library)
    collector = GpuCollector(NvmlSession(log, gpm=gpm, slow_every=slow_every, counter_every=counter_every))
    cpu: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    made: dict[str, int] = dict.fromkeys(TIERS, 0)
    wall: dict[str, list[float]] = {tier: [] for tier in TIERS}
    try:
        collector.collect()  # Opens every GPU, and reads every tier: counted as the opening.
        gpus = len(collector.session.known_gpus())
        if not gpus:
            raise RuntimeError("no GPU opened, so there is no collection to count")
        for index in range(1, rounds * math.lcm(slow_every, counter_every) + 1):
            log.tier = ("counter" if index % counter_every == 0 else "slow" if index % slow_every == 0
                        else "fast")
            advance()
            started, clock = time.thread_time(), time.perf_counter()
            collector.collect()
            cpu[log.tier] += time.thread_time() - started
            wall[log.tier].append(time.perf_counter() - clock)
            made[log.tier] += 1
    finally:
        log.tier = "close"
        collector.close()
    tiers = [tier for tier in TIERS if made[tier]]
    return Collections(gpus, {tier: made[tier] for tier in tiers}, {tier: log.tallies[tier] for tier in tiers},
                       {tier: cpu[tier] / made[tier] for tier in tiers}, {tier: wall[tier] for tier in tiers})
