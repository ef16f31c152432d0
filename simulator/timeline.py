"""Piecewise-constant workloads and their exact integrals.

A training job repeats a cycle of phases (compute, then communication); every
simulated quantity is constant within a phase. A counter is the integral of
its rate, computed exactly from the cycle rather than accumulated tick by
tick, so it never goes backwards and reads the same however often, or however
rarely, the node is scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Levels:
    """What a GPU does in one phase, as shares: of utilisation, power limit, max SM clock, link rate;
    `blocked`, the share of the phase a congested port spends waiting to send; and what GPM measures: the
    share of SMs busy, of time the tensor pipes work, and of DRAM bandwidth used."""

    utilization: float
    power: float
    sm_clock: float
    network: float
    memory_copy: float
    blocked: float = 0.0
    sm_active: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0

    def capped(self, share: float) -> Levels:
        """The same phase on a GPU whose clocks are held at `share` of what they would be: power and
        memory traffic fall with them; the SMs and tensor pipes stay as busy, for longer."""
        return replace(self, power=self.power * share, sm_clock=self.sm_clock * share,
                       memory_copy=self.memory_copy * share, dram=self.dram * share)


@dataclass(frozen=True)
class Segment:
    """From `start` to `end`, the phases in `cycle` repeat, each lasting its given seconds, counted from
    `origin` (the segment's start where None). A job's nodes share its origin, the moment the job began, so
    they step together however late each of them noticed the job."""

    start: float
    end: float
    cycle: tuple[tuple[float, Levels], ...]
    origin: float | None = None

    @property
    def period(self) -> float:
        return sum(seconds for seconds, _ in self.cycle)

    @property
    def _origin(self) -> float:
        return self.start if self.origin is None else self.origin

    def phase_at(self, t: float) -> Levels:
        offset = (t - self._origin) % self.period
        for seconds, phase in self.cycle:
            if offset < seconds:
                return phase
            offset -= seconds
        return self.cycle[-1][1]

    def integral(self, rate: Callable[[Levels], float], until: float) -> float:
        """The integral of `rate(phase)` from the segment's start to `until` (clipped to the segment)."""
        stop = min(until, self.end)
        if stop <= self.start:
            return 0.0
        return self._since_origin(rate, stop) - self._since_origin(rate, self.start)

    def _since_origin(self, rate: Callable[[Levels], float], t: float) -> float:
        """The integral of `rate(phase)` from the origin to `t`, as if the cycle had run all along."""
        per_cycle = sum(seconds * rate(phase) for seconds, phase in self.cycle)
        cycles, rest = divmod(t - self._origin, self.period)
        total = cycles * per_cycle
        for seconds, phase in self.cycle:
            step = min(seconds, rest)
            total += step * rate(phase)
            rest -= step
            if rest <= 0:
                break
        return total


def phase_at(segments: Sequence[Segment], t: float) -> Levels:
    for segment in segments:
        if segment.start <= t < segment.end:
            return segment.phase_at(t)
    return segments[-1].phase_at(t)


def integral(segments: Sequence[Segment], rate: Callable[[Levels], float], until: float) -> float:
    return sum(segment.integral(rate, until) for segment in segments)


def overlap(start: float, end: float | None, until: float) -> float:
    """Seconds of [start, end) that lie before `until`."""
    stop = until if end is None else min(end, until)
    return max(0.0, stop - start)
