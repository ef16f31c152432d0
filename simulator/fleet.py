"""The simulated fleet: nodes, the training jobs they run, and the faults injected into them.

Each node owns a `SimulatedNvml` with eight boards and an in-memory sysfs tree
(InfiniBand and Ethernet ports, hwmon and thermal zones, PCI devices), and is
collected by the collectors `gpufleet exporter` runs, built by the same code
(`exporter.node`) from the exporter's default flags. Everything a node reports is a
function of simulated time: the workload is a repeating cycle of compute and
communication phases, and each fault changes the node's state between its start
and end. A node's clock is frozen while it is collected, so every value it
reports in one scrape describes one instant.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field, replace
from operator import attrgetter

import pynvml
from prometheus_client import ProcessCollector
from prometheus_client.metrics_core import Metric

from gpufleet.exporter import node as exporter_node
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.simulated.board import (
    GpmActivity,
    GpuTelemetry,
    SimulatedGpu,
    SimulatedProcess,
    nvlink_kib_for,
)
from gpufleet.exporter.gpu.simulated.host import mig_devices, simulated_board
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.tree import MemoryTree
from gpufleet.simulator import rates as fault_rates
from gpufleet.simulator.churn import Churn
from gpufleet.simulator.faults import XIDS, Cause, Fault
from gpufleet.simulator.faults import FaultKind as Kind
from gpufleet.simulator.layout import Job, draw
from gpufleet.simulator.timeline import Levels, Segment, integral, overlap, phase_at

IB_PORTS = tuple(f"mlx5_{i}/1" for i in range(8))
ETHERNET = {"eth0": 25_000, "eth1": 100_000}  # Mb/s: management and storage networks.
IB_BYTES_PER_SECOND = 400 * 125_000_000  # NDR, 400 Gb/s.
_FOREVER = float("inf")
_DUE_SHARE = 0.9  # The share of its interval after which a node's visit runs a collector.
log = logging.getLogger(__name__)
_MIB = 1024 * 1024


IDLE = Levels(0.0, 0.1, 0.175, 0.0005, 0.0)
COMPUTE = Levels(0.97, 0.92, 0.98, 0.02, 0.45, sm_active=0.88, tensor=0.62, dram=0.55)
# A collective runs NCCL's kernels on a few SMs: NVML counts the GPU busy while the tensor pipes idle.
COMM = Levels(0.86, 0.55, 1.0, 0.65, 0.2, sm_active=0.2, tensor=0.02, dram=0.3)
# NCCL spins while a peer is late: busy to NVML, but cool, and doing no math.
WAIT = Levels(0.9, 0.4, 1.0, 0.02, 0.05, sm_active=0.06, dram=0.01)
STALL = Levels(0.0, 0.15, 1.0, 0.0005, 0.0)  # The GPUs wait on their host: no kernel runs; too short to clock down.
# port_xmit_wait ticks per second a port counts while it waits to send: the tick is the HCA's own.
_WAIT_TICKS_PER_SECOND = 150e6
_DAY = 86400.0
# The host beside the GPUs (CPUs, NICs, fans, drives), modelled rather than measured; the cap is a DGX H100's
# published 10.2 kW system maximum.
NODE_HOST_WATTS = 1400.0
NODE_HOST_BUSY_WATTS = 1000.0
NODE_POWER_CAP_WATTS = 10200.0


def node_names(count: int) -> list[str]:
    return [f"gpu-node-{index:04d}" for index in range(1, count + 1)]


# The rate of one quantity in each phase, for the timeline's integrals (hashable: they key the integral cache).
_network, _power, _blocked, _utilization, _sm_active, _tensor, _dram = (
    attrgetter(name) for name in ("network", "power", "blocked", "utilization", "sm_active", "tensor", "dram"))


def collector_flags(collect_interval: float) -> argparse.Namespace:
    """The exporter's defaults, with no collector's interval longer than the fleet's collection.

    A fleet collected every second stands for a faster clock (the end-to-end tests run the rules eight
    times faster than production). A GPU collector left on its five seconds would then sample a training
    step about once a step, where production's 15-second scrapes see a 40-second step three times.
    """
    flags = exporter_node.defaults()
    for name, value in vars(flags).items():
        if name.startswith("collector_") and name.endswith("_interval"):
            setattr(flags, name, min(value, collect_interval))
    return flags


def _collect_each(collectors: Sequence[ScheduledCollector]) -> None:
    for collector in collectors:
        collector.collect_now()


def _text(read: Callable[..., object], *args: object) -> Callable[[], str]:
    """A file whose content is `read(*args)` at the moment it is read."""
    return lambda: str(read(*args))


def _wave(t: float, phase: float) -> float:
    """Small, deterministic noise in [-1, 1]."""
    return math.sin(1.7 * t + phase) * 0.6 + math.sin(0.23 * t + 2 * phase) * 0.4


def _spread(key: str) -> tuple[float, float]:
    """A board's own fixed deviations of power and clock, each in [-1, 1]: no two boards draw or clock alike."""
    rng = random.Random(key)
    return rng.uniform(-1.0, 1.0), rng.uniform(-1.0, 1.0)


def _daily(t: float) -> float:
    """The machine room's daily cycle in [0, 1]: 0 at the coolest hour (04:00 on the simulated clock), 1 at
    the warmest (16:00)."""
    return 0.5 - 0.5 * math.cos(2 * math.pi * (t / _DAY - 4 / 24))


class Node:
    """One simulated GPU node and the exporter collectors that read it."""

    def __init__(self, fleet: Fleet, index: int, name: str, gpus: int) -> None:
        self.fleet = fleet
        self.index = index
        self.name = name
        self.ports = IB_PORTS + tuple(ETHERNET)
        self.t = 0.0  # The node's frozen clock, in simulated seconds since the fleet started.
        self.lock = threading.Lock()  # One collection at a time: the fleet's thread, or a first scrape.
        self.fired: set[str] = set()  # Faults whose one-off events (XIDs, exporter restarts) have happened.
        self.collected = False
        self._tenures: list[tuple[float, Job | None]] = [(0.0, None)]  # (from when, the job it runs)
        self._segments: tuple[tuple[int, int], list[Segment]] = ((-1, 0), [])
        self._telemetry_at: tuple[float, dict[int, GpuTelemetry]] = (-1.0, {})
        self._network_at: tuple[float, float] = (-1.0, 0.0)
        self._ib_high: dict[tuple[str, str], tuple[float, int]] = {}  # (port, direction) -> (when, count) served
        self._integrals: tuple[list[Segment], dict[tuple[Callable[[Levels], float], float], float]] = ([], {})
        self.boards = [simulated_board(gpu, f"{fleet.seed}:{name}", self._telemetry, busy=self._busy_for(gpu),
                                       activity=self._activity_for(gpu)) for gpu in range(gpus)]
        self._spreads = [_spread(f"{fleet.seed}:{name}:{gpu}") for gpu in range(gpus)]
        self.nvml = SimulatedNvml(self.boards, clock=lambda: self.t)
        self.sysfs = MemoryTree()
        self.procfs = MemoryTree()
        self._build_sysfs()
        # The simulated driver wakes the XID watcher's event wait when unloaded (see close()): it can wait long.
        self.hardware = Hardware(self.nvml, self.sysfs, self.procfs, nvml_event_wait_ms=30_000)
        self.collectors = exporter_node.build(fleet.exporter_flags, self.hardware)
        self._last_tick = [-_FOREVER] * len(self.collectors)
        self.exposition = Exposition(self.collectors, fleet.process_metrics)

    # Workload -------------------------------------------------------------------------------------

    def assign(self, job: Job | None) -> None:
        """Run `job` (or nothing) on every GPU of this node from its time on, with a process whose cgroup
        names the job."""
        self._tenures.append((self.t, job))  # One given at the same instant as the last leaves it zero long.
        for board in self.boards:
            for process in board.processes:
                self.procfs.remove(str(process.pid))
            board.processes = []
        if job is None:
            return
        for board in self.boards:
            pid = 100000 + self.index * 10 + board.index
            # On a board in MIG mode the job runs in its first GPU instance; the others stay empty.
            instance = board.mig[0].gpu_instance if board.mig else None
            board.processes = [SimulatedProcess(pid, job.cgroup(self.index, board.index), gpu_instance=instance)]
            self.procfs.set(f"{pid}/cgroup", f"0::{board.processes[0].cgroup}")

    @property
    def job(self) -> Job | None:
        """The job the node runs now: the last it was assigned."""
        return self._tenures[-1][1]

    def segments(self) -> list[Segment]:
        """The node's phase timeline, every job it has run in turn; rebuilt only when the faults or its job
        change. Counters are integrals over it, so a node that changes jobs keeps the history it had."""
        key = (self.fleet.fault_version, len(self._tenures))
        if self._segments[0] == key:
            return self._segments[1]
        segments = []
        ends = [start for start, _ in self._tenures[1:]] + [_FOREVER]
        for (begin, job), finish in zip(self._tenures, ends, strict=True):
            if job is None:
                segments.append(Segment(begin, finish, ((1.0, IDLE),)))
                continue
            stragglers = [f for f in self.fleet.faults if f.kind is Kind.STRAGGLER and f.node in job.nodes]
            edges = sorted({begin, *(t for f in stragglers for t in (f.start, f.end) if t is not None
                                     and begin < t < finish)})
            for start, end in zip(edges, [*edges[1:], finish], strict=True):
                slow: dict[str, Fault] = {}
                for fault in sorted((f for f in stragglers if f.active(start)), key=lambda f: f.size):
                    slow[fault.node] = fault  # The largest of one node's slowdowns.
                segments.append(Segment(start, end, self._cycle(job, slow)))
        self._segments = (key, segments)
        return segments

    def _cycle(self, job: Job, stragglers: dict[str, Fault]) -> tuple[tuple[float, Levels], ...]:
        """One training step of this node: the job moves at its slowest node's pace, and every other node
        waits out the difference (NCCL spinning) before the step's collectives."""
        compute = job.period * (1 - job.comm_fraction)
        comm = job.period * job.comm_fraction
        pace = job.period * max((f.size for f in stragglers.values()), default=0.0)
        mine = stragglers.get(self.name)
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
        return tuple(cycle)

    def levels(self) -> Levels:
        return phase_at(self.segments(), self.t)

    def straggling(self, cause: Cause) -> Fault | None:
        """The node's active straggler fault of one cause, if any."""
        return next((f for f in self._active(Kind.STRAGGLER, cause=cause) if f.active(self.t)), None)

    def _active(self, kind: Kind, gpu: int | None = None, port: str | None = None,
                cause: Cause | None = None) -> list[Fault]:
        """The node's faults of one kind, on one GPU or port, or (stragglers) of one cause."""
        return [f for f in self.fleet.faults_for(self.name)
                if f.kind == kind and (gpu is None or f.gpu == gpu) and (port is None or f.port == port)
                and (cause is None or f.straggler_cause is cause)]

    def _telemetry(self, board: SimulatedGpu, _seconds: float) -> GpuTelemetry:
        """What one board reports at the node's frozen time, computed once per board and instant."""
        at, cache = self._telemetry_at
        if at != self.t:
            cache = {}
            self._telemetry_at = (self.t, cache)
        if board.index not in cache:
            cache[board.index] = self._compute_telemetry(board)
        return cache[board.index]

    def _compute_telemetry(self, board: SimulatedGpu) -> GpuTelemetry:
        """The phase, plus noise, plus the board's faults."""
        t = self.t
        levels = self.levels()
        noise = 0.015 * _wave(t, board.index + self.index)
        # Healthy boards differ: each draws and clocks a little differently under the same load, and clocks
        # wander with it; a warm afternoon costs every board some clock and warms it by a few degrees.
        power_spread, clock_spread = self._spreads[board.index]
        power_share = max(0.05, levels.power * (1 + noise + 0.02 * power_spread))
        sm_share = levels.sm_clock * (1 + 0.01 * clock_spread + 0.005 * _wave(0.7 * t, board.index) - 0.004 * _daily(t))
        limit = board.power_limit_watts
        energy = self._energy(board, t)
        temperature = 28 + 48 * levels.power + 1.5 * _wave(t, board.index) + 4 * _daily(t)
        if self.straggling(Cause.THERMAL):
            temperature = board.thresholds_celsius[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] + 1
        for fault in self._active(Kind.THERMAL_SLOWDOWN, board.index):
            energy -= 0.2 * limit * self._window_integral(fault, _power)
            if fault.active(t):
                power_share *= 0.8
                sm_share *= 0.6
                temperature = board.thresholds_celsius[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] + 2
        for fault in self._active(Kind.POWER_BRAKE, board.index):
            energy -= 0.5 * limit * self._window_integral(fault, _power)
            if fault.active(t):
                power_share *= 0.5
                sm_share *= 0.5
        memory = self.job.memory_fraction if self.job else 0.0
        return GpuTelemetry(
            utilization=round(min(1.0, max(0.0, levels.utilization + noise)) if self.job else 0.0, 2),
            memory_copy_utilization=round(levels.memory_copy, 2),
            memory_used_bytes=int(board.memory_total_bytes * memory) + 512 * _MIB,
            power_watts=limit * power_share,
            energy_joules=max(0.0, energy),
            temperature_celsius=temperature,
            memory_temperature_celsius=temperature + 7,
            sm_clock_hertz=board.sm_clock_max_hertz * sm_share,
            memory_clock_hertz=board.memory_clock_max_hertz,
            pcie_generation=board.pcie_max_generation,
            pcie_width=board.pcie_max_width // (2 if self._pcie_straggler(board.index) else 1),
        )

    def _busy_for(self, gpu: int) -> Callable[[float, float], float]:
        """The driver's utilisation samples of one board: the busy share of its node's phases over each
        sample's period, with the board's own noise."""
        def busy(start: float, end: float) -> float:
            share = self._mean(_utilization, start, end)
            return share + 0.015 * _wave(end, gpu + self.index) if share > 0 else 0.0  # An idle board reads 0.
        return busy

    def _activity_for(self, gpu: int) -> Callable[[float, float], GpmActivity]:
        """What GPM measures on one board between two instants: its node's phases, with the board's own noise."""
        def activity(start: float, end: float) -> GpmActivity:
            shares = [self._mean(rate, start, end) for rate in (_sm_active, _tensor, _dram)]
            wobble = 1 + 0.015 * _wave(end, gpu + self.index + 0.5)
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
        fault = self.straggling(Cause.PCIE)
        return fault is not None and (fault.gpu or 0) == gpu

    def _energy(self, board: SimulatedGpu, t: float) -> float:
        """Joules the board has drawn by `t`, before any fault's change to its power."""
        return board.power_limit_watts * integral(self.segments(), _power, t)

    def _window_integral(self, fault: Fault, rate: Callable[[Levels], float]) -> float:
        """The integral of `rate(phase)` over the part of `fault` that lies before now."""
        stop = self.t if fault.end is None else min(fault.end, self.t)
        if stop <= fault.start:
            return 0.0
        return integral(self.segments(), rate, stop) - integral(self.segments(), rate, fault.start)

    # Faults ---------------------------------------------------------------------------------------

    def _seconds_active(self, kind: Kind, gpu: int | None = None, port: str | None = None,
                        cause: Cause | None = None) -> float:
        """Seconds the node's faults of one kind on one GPU or port (or of one cause) have been active, up to now."""
        return sum(overlap(f.start, f.end, self.t) for f in self._active(kind, gpu, port, cause))

    def _counted(self, kind: Kind, gpu: int | None = None, port: str | None = None) -> int:
        """Events the node's faults of one kind on one GPU or port have counted, each at its rate, up to now."""
        return int(sum(f.size * overlap(f.start, f.end, self.t) for f in self._active(kind, gpu, port)))

    def apply_faults(self) -> None:
        """Bring every board's health state to what the faults say at the node's time."""
        t = self.t
        # A straggler capped by heat or power holds every board's slowdown reason, for as long as it lasts.
        hot, braked = self.straggling(Cause.THERMAL), self.straggling(Cause.POWER)
        hot_seconds = self._seconds_active(Kind.STRAGGLER, cause=Cause.THERMAL)
        braked_seconds = self._seconds_active(Kind.STRAGGLER, cause=Cause.POWER)
        for board in self.boards:
            gpu = board.index
            board.errors = ({"*": pynvml.NVML_ERROR_GPU_IS_LOST}
                            if any(f.active(t) for f in self._active(Kind.GPU_LOST, gpu)) else {})
            events = 0
            if any(f.active(t) for f in self._active(Kind.THERMAL_SLOWDOWN, gpu)):
                events |= pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
            if hot:
                events |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
            if any(f.active(t) for f in self._active(Kind.POWER_BRAKE, gpu)) or braked:
                events |= pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown
            board.clock_events = events
            board.violation_seconds = {
                pynvml.NVML_PERF_POLICY_THERMAL: self._seconds_active(Kind.THERMAL_SLOWDOWN, gpu) + hot_seconds,
                pynvml.NVML_PERF_POLICY_POWER: self._seconds_active(Kind.POWER_BRAKE, gpu) + braked_seconds,
            }
            dbe = sum(1 for f in self._active(Kind.ECC_DBE, gpu) if f.start <= t)
            board.ecc_errors = {("uncorrected", "volatile"): dbe, ("uncorrected", "aggregate"): dbe}
            pending = [f for f in self._active(Kind.ROW_REMAP_PENDING, gpu) if f.start <= t]
            failed = [f for f in self._active(Kind.ROW_REMAP_FAILURE, gpu) if f.start <= t]
            board.remapped_rows = {"uncorrectable": len(pending) + len(failed)}
            board.row_remap_pending = any(f.active(t) for f in pending)
            board.row_remap_failed = any(f.active(t) for f in failed)
            board.pcie_replays = self._counted(Kind.PCIE_REPLAY_STORM, gpu)
            down = {f.link: f for f in self._active(Kind.NVLINK_DOWN, gpu) if f.active(t) and f.link is not None}
            board.nvlinks_down = set(down)
            board.nvlink_stopped_kib = {link: nvlink_kib_for(self._energy(board, f.start)) for link, f in down.items()}
            board.nvlink_errors = {}
            for fault in self._active(Kind.NVLINK_CRC, gpu):
                if fault.link is not None:
                    key = (fault.link, "crc_flit")
                    errors = int(fault.size * overlap(fault.start, fault.end, t))
                    board.nvlink_errors[key] = board.nvlink_errors.get(key, 0) + errors
        self._fire_events()

    def _fire_events(self) -> None:
        """Raise each fault's XID once, when the node's time first passes the fault's start."""
        for fault in self.fleet.faults_for(self.name):
            code = fault.xid if fault.kind is Kind.XID else XIDS.get(fault.kind)
            if code is not None and fault.start <= self.t and fault.id not in self.fired:
                self.fired.add(fault.id)
                self.nvml.inject_xid(fault.gpu or 0, code)

    def has_at(self, kind: Kind, t: float) -> bool:
        """Whether a fault of `kind` is active on the node at time `t`, read without touching the node's clock:
        the server asks it of a scrape's instant before the node is advanced to it."""
        return any(f.kind is kind and f.active(t) for f in self.fleet.faults_for(self.name))

    def _restart_if_due(self) -> None:
        """A restart that has ended leaves a new exporter process: collectors built afresh, so every counter
        and state the exporter keeps (XID counts, the last utilisation sample read) starts again."""
        ended = [f for f in self._active(Kind.EXPORTER_RESTART) if f.end is not None and f.end <= self.t
                 and f.id not in self.fired]
        if not ended:
            return
        self.fired.update(f.id for f in ended)
        self.stop()  # Its driver reload wakes the old XID watcher, and empties the utilisation sample buffer.
        exporter_node.close(self.collectors)
        self.collectors = exporter_node.build(self.fleet.exporter_flags, self.hardware)
        self._last_tick = [-_FOREVER] * len(self.collectors)
        self.exposition = Exposition(self.collectors, self.fleet.process_metrics)
        self.start()

    # Sysfs ----------------------------------------------------------------------------------------

    def _network_integral(self) -> float:
        """Link-rate seconds of traffic so far; every port file of one instant reads the same, computed once."""
        at, value = self._network_at
        if at != self.t:
            value = integral(self.segments(), _network, self.t)
            self._network_at = (self.t, value)
        return value

    def _ib_bytes(self, port: str, direction: str) -> int:
        """Bytes through an InfiniBand port: the job's traffic, raised by saturation, stopped while down."""
        total = IB_BYTES_PER_SECOND * self._network_integral()
        for fault in self._active(Kind.NIC_SATURATION, port=port):
            if fault.direction == direction:
                total += IB_BYTES_PER_SECOND * (fault.size * overlap(fault.start, fault.end, self.t)
                                                - self._window_integral(fault, _network))
        for fault in self._active(Kind.IB_LINK_DOWN, port=port):
            total -= IB_BYTES_PER_SECOND * self._window_integral(fault, _network)
        for fault in self._active(Kind.IB_LINK_FLAP, port=port):
            total -= 0.5 * IB_BYTES_PER_SECOND * self._window_integral(fault, _network)
        # While a port is down its count is a difference of integrals, which rounding moves by a byte either way
        # when a fault elsewhere splits the timeline; a hardware counter never steps back (Prometheus would read
        # a reset, and the whole count as one interval's traffic), so neither does this one as time goes on.
        value, key = int(max(0.0, total)), (port, direction)
        at, high = self._ib_high.get(key, (-_FOREVER, 0))
        if self.t >= at:
            value = max(value, high)
            self._ib_high[key] = (self.t, value)
        return value

    def _ib_down(self, port: str) -> bool:
        t = self.t
        if any(f.active(t) for f in self._active(Kind.IB_LINK_DOWN, port=port)):
            return True
        flaps = self._active(Kind.IB_LINK_FLAP, port=port)
        return any(f.active(t) and (t - f.start) % f.size < f.size / 2 for f in flaps)  # Down the first half.

    def _ib_link_downed(self, port: str) -> int:
        t = self.t
        downs = sum(1 for f in self._active(Kind.IB_LINK_DOWN, port=port) if f.start <= t)
        for fault in self._active(Kind.IB_LINK_FLAP, port=port):
            window = overlap(fault.start, fault.end, t)
            downs += math.ceil(window / fault.size) if window > 0 else 0
        return downs

    def _ib_rate(self, port: str) -> str:
        degraded = any(f.active(self.t) for f in self._active(Kind.IB_RATE_DEGRADED, port=port))
        return "200 Gb/sec (4X HDR)" if degraded else "400 Gb/sec (4X NDR)"

    def _ib_xmit_wait(self, port: str) -> int:
        ticks = int(20_000 * self._network_integral()) + self._counted(Kind.IB_CONGESTION, port=port)
        if port == self._congested_port():
            ticks += int(_WAIT_TICKS_PER_SECOND * integral(self.segments(), _blocked, self.t))
        return ticks

    def _congested_port(self) -> str | None:
        """The port a NIC straggler congests: its own, or the node's first InfiniBand port. Only one per node,
        so the waiting its timeline records is counted once."""
        stragglers = self._active(Kind.STRAGGLER, cause=Cause.NIC)
        return (stragglers[0].port or IB_PORTS[0]) if stragglers else None

    def _node_power_microwatts(self) -> int:
        """The node's ACPI power meter: its boards, plus a host (CPUs, NICs, fans, drives) that draws more
        under a job; the same instant as its boards' own readings."""
        boards = sum(self._telemetry(board, self.t).power_watts for board in self.boards)
        host = NODE_HOST_WATTS + NODE_HOST_BUSY_WATTS * (self.levels().power if self.job else 0.0)
        return int(1e6 * (boards + host))

    def _core_temperature(self, offset: int) -> int:
        return int(1000 * (42 + (9 if self.job else 0) + 2 * _wave(self.t, offset)))

    def _build_sysfs(self) -> None:
        tree = self.sysfs
        for port in IB_PORTS:
            self._build_infiniband(port)
        for interface, megabits in ETHERNET.items():
            self._build_ethernet(interface, megabits)
        for chip in range(2):
            base = f"class/hwmon/hwmon{chip}"
            tree.set(f"{base}/name", "coretemp")
            tree.link(f"{base}/device", f"../../../coretemp.{chip}")
            for sensor in range(1, 17):
                tree.set(f"{base}/temp{sensor}_input", _text(self._core_temperature, chip + sensor))
                tree.set(f"{base}/temp{sensor}_label", f"Core {sensor - 1}")
                tree.set(f"{base}/temp{sensor}_max", "84000")
                tree.set(f"{base}/temp{sensor}_crit", "100000")
        meter = "class/hwmon/hwmon2"
        tree.set(f"{meter}/name", "power_meter")
        tree.link(f"{meter}/device", "../../../ACPI000D:00")
        tree.set(f"{meter}/power1_average", _text(self._node_power_microwatts))
        tree.set(f"{meter}/power1_average_interval", "1000")
        tree.set(f"{meter}/power1_cap", str(int(1e6 * NODE_POWER_CAP_WATTS)))
        tree.set("class/thermal/thermal_zone0/type", "x86_pkg_temp")
        tree.set("class/thermal/thermal_zone0/temp", lambda: str(1000 * (44 + (9 if self.job else 0))))
        for board in self.boards:
            address = board.pci_bus_id.removeprefix("0000")
            tree.set(f"bus/pci/devices/{address.lower()}/vendor", "0x10de")
            tree.set(f"bus/pci/devices/{address.lower()}/class", "0x030200")
        for switch in range(4):
            tree.set(f"bus/pci/devices/0000:{5 + switch:02x}:00.0/vendor", "0x10de")
            tree.set(f"bus/pci/devices/0000:{5 + switch:02x}:00.0/class", "0x068000")

    def _build_infiniband(self, port: str) -> None:
        tree = self.sysfs
        device, number = port.split("/")
        base = f"class/infiniband/{device}"
        for name, value in (("board_id", "MT_0000000838"), ("fw_ver", "28.39.1002"), ("hca_type", "MT4129"),
                            ("node_guid", f"946d:ae03:00{self.index % 256:02x}:{int(device[5:]):04x}")):
            tree.set(f"{base}/{name}", value)
        ports = f"{base}/ports/{number}"
        tree.set(f"{ports}/rate", _text(self._ib_rate, port))
        tree.set(f"{ports}/link_layer", "InfiniBand")
        tree.set(f"{ports}/state", lambda: "1: DOWN" if self._ib_down(port) else "4: ACTIVE")
        tree.set(f"{ports}/phys_state", lambda: "2: Polling" if self._ib_down(port) else "5: LinkUp")
        for direction, name in (("tx", "xmit"), ("rx", "rcv")):
            tree.set(f"{ports}/counters_ext/port_{name}_data_64", _text(self._ib_units, port, direction, 4))
            tree.set(f"{ports}/counters_ext/port_{name}_packets_64", _text(self._ib_units, port, direction, 4096))
        tree.set(f"{ports}/counters/port_xmit_wait", _text(self._ib_xmit_wait, port))
        tree.set(f"{ports}/counters/symbol_error", _text(self._counted, Kind.SYMBOL_ERRORS, None, port))
        tree.set(f"{ports}/counters/link_downed", _text(self._ib_link_downed, port))
        for name in ("link_error_recovery", "port_rcv_errors", "port_xmit_discards",
                     "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors", "VL15_dropped"):
            tree.set(f"{ports}/counters/{name}", "0")
        for name in ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err"):
            tree.set(f"{ports}/hw_counters/{name}", "0")

    def _ib_units(self, port: str, direction: str, size: int) -> int:
        """Bytes through a port counted in units of `size` (4-byte words, 4 KiB packets)."""
        return self._ib_bytes(port, direction) // size

    def _build_ethernet(self, interface: str, megabits: int) -> None:
        base = f"class/net/{interface}"
        link_bytes = megabits * 125_000
        # Management traffic is steady; the storage network reads training data at 4% of its link.
        share = 0.001 if interface == "eth0" else 0.04

        def bytes_moved(direction: str) -> int:
            total = share * link_bytes * self.t
            for fault in self._active(Kind.NIC_SATURATION, port=interface):
                if fault.direction == direction:
                    total += (fault.size - share) * link_bytes * overlap(fault.start, fault.end, self.t)
            return int(total)

        self.sysfs.set(f"{base}/statistics/rx_bytes", lambda: str(bytes_moved("rx")))
        self.sysfs.set(f"{base}/statistics/tx_bytes", lambda: str(bytes_moved("tx")))
        self.sysfs.set(f"{base}/statistics/rx_packets", lambda: str(bytes_moved("rx") // 9000))
        self.sysfs.set(f"{base}/statistics/tx_packets", lambda: str(bytes_moved("tx") // 9000))
        for name in ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped"):
            self.sysfs.set(f"{base}/statistics/{name}", "0")
        self.sysfs.set(f"{base}/speed", str(megabits))
        self.sysfs.set(f"{base}/operstate", "up")
        self.sysfs.set(f"{base}/carrier_changes", "1")
        self.sysfs.set(f"{base}/mtu", "9000")
        self.sysfs.set(f"{base}/address", f"b4:96:91:{self.index >> 8 & 0xff:02x}:{self.index & 0xff:02x}:"
                                          f"{list(ETHERNET).index(interface):02x}")
        self.sysfs.set(f"{base}/duplex", "full")

    # Collection -----------------------------------------------------------------------------------

    def collect(self, now: float, wall: Callable[[], float]) -> None:
        """Collect what is due at simulated time `now` with the exporter's collectors, in the calling thread.

        The collectors run one after another: a thousand nodes cannot each start five threads per
        collection, and the node's clock is frozen for the whole pass anyway.
        """
        with self.lock:
            self.t = now
            churn = self.fleet.churn
            if churn is not None and (job := churn.job_at(self.name, now)) is not self.job:
                self.assign(job)
            self._restart_if_due()
            self.apply_faults()
            started = wall()
            # A visit a moment early still finds a collector due: the fleet's schedule visits each node once
            # per interval, and an exact test would leave a collector whose interval equals it for a second visit.
            due = [c for position, c in enumerate(self.collectors)
                   if started - self._last_tick[position] >= c.interval * _DUE_SHARE]
            for position, collector in enumerate(self.collectors):
                if collector in due:
                    self._last_tick[position] = started
            _collect_each(due)
            self.collected = True

    async def scrape(self, now: float, wall: Callable[[], float]) -> bytes:
        """Collect what is due at `now` in a worker thread, and return the body a scrape would get."""
        await asyncio.to_thread(self.collect, now, wall)
        return self.exposition.body()

    def start(self) -> None:
        for collector in self.collectors:
            collector.start()

    def stop(self) -> None:
        """Ask the collectors to stop, then unload the simulated driver: that wakes the XID watcher's wait."""
        for collector in self.collectors:
            collector.stop()
        self.nvml.reload_driver()

    def close(self) -> None:
        self.stop()
        exporter_node.close(self.collectors)


class ProcessMetrics:
    """The simulator's own process_* families, read at most once a second and shared by every node.

    Every simulated node reports the one simulator process; reading /proc for each of a thousand
    scrapes, with a file descriptor per scrape connection to list, cost more than the scrape itself.
    """

    def __init__(self, max_age_seconds: float = 1.0) -> None:
        self._collector = ProcessCollector(registry=None)
        self._max_age = max_age_seconds
        self._read_at = -_FOREVER
        self._families: list[Metric] = []

    def __call__(self) -> list[Metric]:
        now = time.monotonic()
        if now - self._read_at >= self._max_age:
            self._families = list(self._collector.collect())
            self._read_at = now
        return self._families


@dataclass
class Fleet:
    """Nodes, jobs and faults; the HTTP side and the control API work on this."""

    node_count: int
    gpus_per_node: int = 8
    seed: int = 0
    idle_share: float = 0.15
    faults: list[Fault] = field(default_factory=list)
    fault_version: int = 0
    nodes: dict[str, Node] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list, init=False)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # Every node runs the collectors `gpufleet exporter` runs with no flags.
    exporter_flags: argparse.Namespace = field(default_factory=exporter_node.defaults)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _by_node: dict[str, list[Fault]] = field(default_factory=dict, init=False)
    process_metrics: ProcessMetrics = field(default_factory=ProcessMetrics, init=False)
    # The jobs to run; drawn from the seed (with `idle_share` of the nodes idle) where none are given.
    layout: InitVar[Sequence[Job] | None] = None
    # Mean simulated seconds a job lasts before another takes its nodes (see `churn`); None: jobs never end.
    job_lifetime: InitVar[float | None] = None
    churn: Churn | None = field(default=None, init=False)

    def __post_init__(self, layout: Sequence[Job] | None, job_lifetime: float | None) -> None:
        names = node_names(self.node_count)
        self.nodes = {name: Node(self, index, name, self.gpus_per_node) for index, name in enumerate(names, 1)}
        self._set(list(self.faults))
        self.jobs = list(layout) if layout is not None else draw(names, self.seed, self.idle_share)
        for job in self.jobs:
            for name in job.nodes:
                self.nodes[name].assign(job)
        if job_lifetime is not None:
            self.churn = Churn(self.jobs, job_lifetime, self.seed)

    def split(self, node: str, gpu: int, profiles: Sequence[str]) -> None:
        """Put one board in MIG mode with a GPU instance per profile; the node's job moves into the first.

        Raises ValueError naming what is wrong: an unknown node or GPU, or a profile not of the form 1g.10gb.
        """
        if node not in self.nodes:
            raise ValueError(f"no node {node!r}")
        if not 0 <= gpu < self.gpus_per_node:
            raise ValueError(f"{node} has no GPU {gpu}")
        board = self.nodes[node].boards[gpu]
        board.mig = mig_devices(f"{self.seed}:{node}:{gpu}", profiles)
        board.processes = [replace(p, gpu_instance=board.mig[0].gpu_instance) for p in board.processes]

    def jobs_at(self, t: float) -> list[Job]:
        """The jobs running at simulated time `t`."""
        return self.jobs if self.churn is None else self.churn.jobs_at(t)

    def faults_for(self, node: str) -> list[Fault]:
        return self._by_node.get(node, [])

    def _set(self, faults: list[Fault]) -> None:
        """Replace the fault list and its index by node: a fleet drawn from fault rates holds thousands of
        faults, and every node reads its own many times per collection."""
        by_node: dict[str, list[Fault]] = {}
        for fault in faults:
            by_node.setdefault(fault.node, []).append(fault)
        self.faults, self._by_node = faults, by_node
        self.fault_version += 1

    def add(self, faults: Sequence[Fault]) -> None:
        with self._lock:
            self._set([*self.faults, *faults])

    def remove(self, fault_id: str | None = None) -> list[Fault]:
        """Remove one fault, or all of them; returns what was removed."""
        with self._lock:
            removed = [f for f in self.faults if fault_id is None or f.id == fault_id]
            gone = {id(f) for f in removed}
            self._set([f for f in self.faults if id(f) not in gone])
        return removed

    def draw_faults(self, rates: Sequence[fault_rates.Rate], horizon: float, seed: int) -> list[Fault]:
        """The faults `rates` give this fleet's GPUs, ports and nodes in [0, horizon) simulated seconds."""
        ports = {name: node.ports for name, node in self.nodes.items()}
        return fault_rates.draw(rates, ports, self.gpus_per_node, horizon, seed, self.ids)

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    async def collect_forever(self, clock: Callable[[], float], interval: float) -> None:
        """Collect every node once per `interval`, spread evenly over it, as each exporter would on its own.

        Scrapes are then served from each node's latest snapshot, as the exporter serves them: a scrape
        costs almost nothing, and a fleet too large for the CPU is collected less often rather than
        answering its scrapes too late. Each node is collected in the event loop's own thread, and the
        loop serves waiting scrapes between nodes. A worker thread would cost more than it saves: handing
        each node over and back was a fifth of a thousand-node fleet's CPU, and a thread collecting
        nonstop held the interpreter lock so long that scrapes timed out.
        """
        nodes = list(self.nodes.values())
        loop = asyncio.get_running_loop()
        gap = interval / len(nodes)
        next_start = loop.time()
        while True:
            for node in nodes:
                try:
                    node.collect(clock(), time.monotonic)
                except Exception:  # One node's surprise must not stop the fleet; it is logged.
                    log.exception("collecting %s failed", node.name)
                next_start += gap
                delay = next_start - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    continue
                # Behind: run on without sleeping until back on schedule, so that a burst of scrapes does not
                # push every later node's collection back for good; more than a whole interval behind, the
                # CPU cannot keep up, and the schedule starts again from now rather than racing.
                if -delay > interval:
                    next_start = loop.time()
                await asyncio.sleep(0)  # Let scrapes through between nodes.

    def close(self) -> None:
        """Stop every node before waiting for any: each wait is then for a thread that is already ending."""
        for node in self.nodes.values():
            node.stop()
        exporter_node.close([collector for node in self.nodes.values() for collector in node.collectors])
