"""The work one simulated node runs over time, and what its boards read while it runs it.

A node runs its jobs in turn (`tenures`); each job repeats a training step of
compute and communication phases, which stragglers in the job stretch
(`segments`). Every reading a board gives is a function of the node's frozen
clock over that timeline: counters are exact integrals of their rates, so they
never go backwards however rarely a node is collected.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter

import pynvml

from gpufleet.exporter.gpu.simulated.board import MIB, GpmActivity, GpuTelemetry, SimulatedGpu
from gpufleet.simulator.faults import Cause, Fault
from gpufleet.simulator.faults import FaultKind as Kind
from gpufleet.simulator.layout import Job
from gpufleet.simulator.node_state import NodeState
from gpufleet.simulator.timeline import Levels, Segment, integral, phase_at

IDLE = Levels(0.0, 0.1, 0.175, 0.0005, 0.0)
COMPUTE = Levels(0.97, 0.92, 0.98, 0.02, 0.45, sm_active=0.88, tensor=0.62, dram=0.55)
# A collective runs NCCL's kernels on a few SMs: NVML counts the GPU busy while the tensor pipes idle.
COMM = Levels(0.86, 0.55, 1.0, 0.65, 0.2, sm_active=0.2, tensor=0.02, dram=0.3)
# NCCL spins while a peer is late: busy to NVML, but cool, and doing no math.
WAIT = Levels(0.9, 0.4, 1.0, 0.02, 0.05, sm_active=0.06, dram=0.01)
STALL = Levels(0.0, 0.15, 1.0, 0.0005, 0.0)  # The GPUs wait on their host: no kernel runs; too short to clock down.
_FOREVER = math.inf
_DAY = 86400.0

# The rate of one quantity in each phase, for the timeline's integrals (hashable: they key the integral cache).
network, power, blocked, _utilization, _sm_active, _tensor, _dram = (
    attrgetter(name) for name in ("network", "power", "blocked", "utilization", "sm_active", "tensor", "dram"))


def wave(t: float, phase: float) -> float:
    """Small, deterministic noise in [-1, 1]."""
    return math.sin(1.7 * t + phase) * 0.6 + math.sin(0.23 * t + 2 * phase) * 0.4


# How far healthy boards of one model differ, and how far the day moves them all: the spread is what a false
# straggler is made of, so it is taken from measured fleets, never narrowed to suit a detector.
# - Sinha et al., "Not All GPUs Are Created Equal" (SC '22, arXiv 2208.11035): the same application on the same
#   SKU, over 90 % of the GPUs of five clusters, runs 8 % apart on average (22 % at most) between GPUs, from
#   manufacturing variation under the boards' power management, which sets their clocks. Read as the range of
#   the bulk of a normal spread (about 5.4 standard deviations between a box plot's whiskers), one standard
#   deviation is 1.5 % of the clock per board, and 0.53 % for the mean of a node's eight. Its outliers (up to
#   1.5 times the median's time) are stragglers, which the simulator injects as faults, not noise.
# - Llama 3 (arXiv 2407.21783): throughput moved 1 to 2 % over the day with the temperature, every node at once.
CLOCK_SPREAD = 0.015  # One standard deviation of a board's own clock, as a share of the phase's.
POWER_SPREAD = 0.02  # The most a board's own draw differs from its model's, as a share.
DAILY_CLOCK = 0.015  # What the warmest hour takes from every board's clock, as a share.


def spread(key: str) -> tuple[float, float]:
    """A board's own fixed deviations of power (in [-1, 1]) and clock (in standard deviations, normal and cut
    at three): no two boards draw or clock alike."""
    rng = random.Random(key)
    return rng.uniform(-1.0, 1.0), max(-3.0, min(3.0, rng.gauss(0.0, 1.0)))


def _default_limit(board: SimulatedGpu) -> float:
    """The board's default power limit, which a power_capped fault lowers the enforced one from."""
    return board.power_limit_watts if board.power_limit_default_watts is None else board.power_limit_default_watts


def _daily(t: float) -> float:
    """The machine room's daily cycle in [0, 1]: 0 at the coolest hour (04:00 on the simulated clock), 1 at
    the warmest (16:00)."""
    return 0.5 - 0.5 * math.cos(2 * math.pi * (t / _DAY - 4 / 24))


class Workload:
    """One node's jobs over time, its phase timeline, and each board's telemetry at the node's clock."""

    def __init__(self, state: NodeState, spreads: list[tuple[float, float]]) -> None:
        self.state = state
        self.tenures: list[tuple[float, Job | None]] = [(0.0, None)]  # (from when, the job it runs)
        self._spreads = spreads  # Per board: its own deviations of power and clock (`spread`).
        self._segments: tuple[tuple[int, int], list[Segment]] = ((-1, 0), [])
        self._telemetry_at: tuple[float, dict[int, GpuTelemetry]] = (-1.0, {})
        self._integrals: tuple[list[Segment], dict[tuple[Callable[[Levels], float], float], float]] = ([], {})

    def run(self, job: Job | None) -> None:
        """Run `job` (or nothing) from the node's time on; one given at the same instant as the last leaves it
        zero long."""
        self.tenures.append((self.state.t, job))

    @property
    def job(self) -> Job | None:
        """The job the node runs now: the last it was assigned."""
        return self.tenures[-1][1]

    def segments(self) -> list[Segment]:
        """The node's phase timeline, every job it has run in turn; rebuilt only when the faults or its job
        change. Counters are integrals over it, so a node that changes jobs keeps the history it had."""
        key = (self.state.fleet.fault_version, len(self.tenures))
        if self._segments[0] == key:
            return self._segments[1]
        segments = []
        ends = [start for start, _ in self.tenures[1:]] + [_FOREVER]
        for (begin, job), finish in zip(self.tenures, ends, strict=True):
            if job is None:
                segments.append(Segment(begin, finish, ((1.0, IDLE),)))
                continue
            shaping = [f for f in self.state.fleet.faults
                       if f.kind in (Kind.STRAGGLER, Kind.JOB_HANG) and f.node in job.nodes]
            edges = sorted({begin, *(t for f in shaping for t in (f.start, f.end) if t is not None
                                     and begin < t < finish)})
            for start, end in zip(edges, [*edges[1:], finish], strict=True):
                if any(f.kind is Kind.JOB_HANG and f.active(start) for f in shaping):
                    # Every node waits on a peer.
                    segments.append(Segment(start, end, ((job.period, WAIT),), job.started))
                    continue
                slow: dict[str, Fault] = {}
                for fault in sorted((f for f in shaping if f.active(start)), key=lambda f: f.size):
                    slow[fault.node] = fault  # The largest of one node's slowdowns.
                segments.append(Segment(start, end, self._cycle(job, slow), job.started))
        self._segments = (key, segments)
        return segments

    def _cycle(self, job: Job, stragglers: dict[str, Fault]) -> tuple[tuple[float, Levels], ...]:
        """One training step of this node: the job moves at its slowest node's pace, and every other node
        waits out the difference (NCCL spinning) before the step's collectives."""
        compute = job.period * (1 - job.comm_fraction)
        comm = job.period * job.comm_fraction
        pace = job.period * max((f.size for f in stragglers.values()), default=0.0)
        mine = stragglers.get(self.state.name)
        own = 0.0 if mine is None else job.period * mine.size
        if mine is None:
            cycle = [(compute, COMPUTE), (comm, COMM)]
        elif mine.straggler_cause is Cause.NIC:
            # Its collectives take longer: the same bytes over a longer phase, with its port waiting to send.
            cycle = [(compute, COMPUTE), (comm + own, replace(COMM, network=COMM.network * comm / (comm + own),
                                                                 blocked=own / (comm + own)))]
        elif mine.straggler_cause in (Cause.PCIE, Cause.HOST):
            cycle = [(compute, COMPUTE), (own, STALL), (comm, COMM)]
        else:
            # Clocks capped (heat, power, a bad board) in every phase; only computing takes longer for it.
            share = compute / (compute + own)
            cycle = [(compute + own, COMPUTE.capped(share)), (comm, COMM.capped(share))]
        if pace > own:
            cycle.insert(len(cycle) - 1, (pace - own, WAIT))
        return tuple(self._checkpointed(job, cycle))

    def _checkpointed(self, job: Job, step: list[tuple[float, Levels]]) -> list[tuple[float, Levels]]:
        """The node's cycle with the job's checkpoints: as many steps as fit in its interval, then the write,
        which the writers spend idle (clocked down, as an idle node's GPUs are: a write lasts seconds to minutes,
        not a host stall's fraction of a step) and the others spinning in a barrier."""
        if job.checkpoint is None:
            return step
        steps = max(1, round(job.checkpoint.every / sum(seconds for seconds, _ in step)))
        writes = job.checkpoint.writers == "all" or self.state.name == job.nodes[0]
        return [*step * steps, (job.checkpoint.lasts, IDLE if writes else WAIT)]

    def levels(self) -> Levels:
        return phase_at(self.segments(), self.state.t)

    def telemetry(self, board: SimulatedGpu, _seconds: float) -> GpuTelemetry:
        """What one board reports at the node's frozen time, computed once per board and instant."""
        at, cache = self._telemetry_at
        if at != self.state.t:
            cache = {}
            self._telemetry_at = (self.state.t, cache)
        if board.index not in cache:
            cache[board.index] = self._compute_telemetry(board)
        return cache[board.index]

    def _compute_telemetry(self, board: SimulatedGpu) -> GpuTelemetry:
        """The phase, plus noise, plus the board's faults."""
        t = self.state.t
        levels = self.levels()
        noise = 0.015 * wave(t, board.index + self.state.index)
        # Healthy boards differ: each draws and clocks a little differently under the same load, and clocks
        # wander with it; a warm afternoon costs every board some clock and warms it by a few degrees.
        power_spread, clock_spread = self._spreads[board.index]
        power_share = max(0.05, levels.power * (1 + noise + POWER_SPREAD * power_spread))
        sm_share = min(1.0, levels.sm_clock * (1 + CLOCK_SPREAD * clock_spread + 0.005 * wave(0.7 * t, board.index)
                                               - DAILY_CLOCK * _daily(t)))
        limit, default = board.power_limit_watts, _default_limit(board)
        energy = self.energy(board, t)
        # A cap lowers what a slowdown left of the draw, not the draw again: over their overlap, it takes its share
        # of what the slowdown did not take, so the counter never runs backwards.
        slowdowns = [(f, 0.2) for f in self.state.active(Kind.THERMAL_SLOWDOWN, board.index)]
        slowdowns += [(f, 0.5) for f in self.state.active(Kind.POWER_BRAKE, board.index)]
        for cap in self.state.active(Kind.POWER_CAPPED, board.index):
            energy -= (1 - cap.size) * default * self.window_integral(cap, power)
            for slowdown, share in slowdowns:
                energy += (1 - cap.size) * share * default * self._overlap_integral(cap, slowdown, power)
        temperature = 28 + 48 * levels.power + 1.5 * wave(t, board.index) + 4 * _daily(t)
        if self.state.straggling(Cause.THERMAL):
            temperature = board.thresholds_celsius[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] + 1
        for fault in self.state.active(Kind.THERMAL_SLOWDOWN, board.index):
            energy -= 0.2 * default * self.window_integral(fault, power)
            if fault.active(t):
                power_share *= 0.8
                sm_share *= 0.6
                temperature = board.thresholds_celsius[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] + 2
        for fault in self.state.active(Kind.POWER_BRAKE, board.index):
            energy -= 0.5 * default * self.window_integral(fault, power)
            if fault.active(t):
                power_share *= 0.5
                sm_share *= 0.5
        memory = self.job.memory_fraction if self.job else 0.0
        return GpuTelemetry(
            utilization=round(min(1.0, max(0.0, levels.utilization + noise)) if self.job else 0.0, 2),
            memory_copy_utilization=round(levels.memory_copy, 2),
            memory_used_bytes=int(board.memory_total_bytes * memory) + 512 * MIB,
            power_watts=limit * power_share,
            energy_joules=max(0.0, energy),
            temperature_celsius=temperature,
            memory_temperature_celsius=temperature + 7,
            sm_clock_hertz=board.sm_clock_max_hertz * sm_share,
            memory_clock_hertz=board.memory_clock_max_hertz,
            pcie_generation=board.pcie_max_generation,
            pcie_width=board.pcie_max_width // (2 if self._pcie_straggler(board.index) else 1),
        )

    def busy_for(self, gpu: int) -> Callable[[float, float], float]:
        """The driver's utilisation samples of one board: the busy share of its node's phases over each
        sample's period, with the board's own noise."""
        def busy(start: float, end: float) -> float:
            share = self._mean(_utilization, start, end)
            return share + 0.015 * wave(end, gpu + self.state.index) if share > 0 else 0.0  # An idle board reads 0.
        return busy

    def activity_for(self, gpu: int) -> Callable[[float, float], GpmActivity]:
        """What GPM measures on one board between two instants: its node's phases, with the board's own noise."""
        def activity(start: float, end: float) -> GpmActivity:
            shares = [self._mean(rate, start, end) for rate in (_sm_active, _tensor, _dram, _utilization)]
            wobble = 1 + 0.015 * wave(end, gpu + self.state.index + 0.5)
            return GpmActivity(*(share * wobble for share in shares))
        return activity

    def _mean(self, rate: Callable[[Levels], float], start: float, end: float) -> float:
        return (self._integral(rate, end) - self._integral(rate, start)) / (end - start)

    def _integral(self, rate: Callable[[Levels], float], t: float) -> float:
        """The integral of `rate` over the node's timeline up to `t`: every board of the node asks for the same
        instants, so each is computed once."""
        segments = self.segments()
        timeline, values = self._integrals
        if timeline is not segments or len(values) > 4000:  # Rebuilt by a fault or a new job; or grown.
            values = {}
            self._integrals = (segments, values)
        value = values.get((rate, t))
        if value is None:
            value = values[(rate, t)] = integral(segments, rate, t)
        return value

    def _pcie_straggler(self, gpu: int) -> bool:
        fault = self.state.straggling(Cause.PCIE)
        return fault is not None and (fault.gpu or 0) == gpu

    def energy(self, board: SimulatedGpu, t: float) -> float:
        """Joules the board has drawn by `t` at its default power limit, before any fault's change to its power."""
        return _default_limit(board) * integral(self.segments(), power, t)

    def _overlap_integral(self, one: Fault, other: Fault, rate: Callable[[Levels], float]) -> float:
        """The integral of `rate(phase)` over the part of both faults that lies before now."""
        start = max(one.start, other.start)
        stop = min(self.state.t, *(f.end for f in (one, other) if f.end is not None))
        if stop <= start:
            return 0.0
        return integral(self.segments(), rate, stop) - integral(self.segments(), rate, start)

    def window_integral(self, fault: Fault, rate: Callable[[Levels], float]) -> float:
        """The integral of `rate(phase)` over the part of `fault` that lies before now."""
        stop = self.state.t if fault.end is None else min(fault.end, self.state.t)
        if stop <= fault.start:
            return 0.0
        return integral(self.segments(), rate, stop) - integral(self.segments(), rate, fault.start)
