"""What every part of a simulated node reads: who the node is, its frozen clock, and its faults at that time.

The workload, the fault effects and the sysfs model of a node each hold this one
object, so that they agree on the instant they describe without holding the node.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.simulator.faults import REBOOTS, RESTARTS, Cause, Fault
from gpufleet.simulator.faults import FaultKind as Kind
from gpufleet.simulator.timeline import overlap


class FleetFaults(Protocol):
    """The fleet's faults as a node reads them: all of them (a job's stragglers), and its own."""

    faults: list[Fault]
    fault_version: int  # Changes whenever the fault list does, so that what is derived from it can be cached.

    def faults_for(self, node: str) -> list[Fault]: ...


@dataclass
class NodeState:
    """One node's identity, clock and fault queries; the parts of a `fleet.Node` share it."""

    fleet: FleetFaults
    index: int
    name: str
    t: float = 0.0  # The node's frozen clock, in simulated seconds since the fleet started.
    fired: set[str] = field(default_factory=set)  # Faults whose one-off events (XIDs, restarts) have happened.
    kernel_messages: dict[str, int] = field(default_factory=dict)  # Fault id -> kernel messages it has written.
    started: float = field(default_factory=time.time)  # Unix time of the node's first boot, at its time 0.

    def active(self, kind: Kind, gpu: int | None = None, port: str | None = None,
                cause: Cause | None = None) -> list[Fault]:
        """The node's faults of one kind, on one GPU or port, or (stragglers) of one cause."""
        return [f for f in self.fleet.faults_for(self.name)
                if f.kind == kind and (gpu is None or f.gpu == gpu) and (port is None or f.port == port)
                and (cause is None or f.straggler_cause is cause)]

    def straggling(self, cause: Cause) -> Fault | None:
        """The node's active straggler fault of one cause, if any."""
        return next((f for f in self.active(Kind.STRAGGLER, cause=cause) if f.active(self.t)), None)

    def seconds_active(self, kind: Kind, gpu: int | None = None, port: str | None = None,
                       cause: Cause | None = None) -> float:
        """Seconds the node's faults of one kind on one GPU or port (or of one cause) have been active, up to now."""
        return sum(overlap(f.start, f.end, self.t) for f in self.active(kind, gpu, port, cause))

    def counted(self, kind: Kind, gpu: int | None = None, port: str | None = None) -> int:
        """Events the node's faults of one kind on one GPU or port have counted, each at its rate, up to now."""
        return int(sum(f.size * overlap(f.start, f.end, self.t) for f in self.active(kind, gpu, port)))

    def has_at(self, kind: Kind, t: float) -> bool:
        """Whether a fault of `kind` is active on the node at time `t`, read without touching the node's clock:
        the server asks it of a scrape's instant before the node is advanced to it."""
        return any(f.kind is kind and f.active(t) for f in self.fleet.faults_for(self.name))

    def links_down(self, port: str) -> list[Fault]:
        """The faults that take an InfiniBand port's link down: its own, and its leaf switch's (on its rail, or
        on every port)."""
        return [f for f in self.fleet.faults_for(self.name)
                if (f.kind is Kind.IB_LINK_DOWN and f.port == port)
                or (f.kind is Kind.SWITCH_DOWN and f.port in (None, port))]

    def down_at(self, t: float) -> bool:
        """Whether the node itself is away at `t` (rebooting, or down): nothing of it answers on the network."""
        return any(f.kind in REBOOTS and f.active(t) for f in self.fleet.faults_for(self.name))

    def restarting_at(self, t: float) -> bool:
        """Whether the node's exporter is away at `t` (restarting, or the node rebooting): scrapes are refused."""
        return any(f.kind in RESTARTS and f.active(t) for f in self.fleet.faults_for(self.name))

    def repaired_at(self, kinds: Collection[Kind], gpu: int) -> float:
        """When the latest repair of `kinds` touching GPU `gpu` (its own, or the whole node's) ended, up to now;
        minus infinity where none has. A fault that began before it no longer shows."""
        return max((f.end for f in self.fleet.faults_for(self.name)
                    if f.kind in kinds and (f.gpu is None or f.gpu == gpu) and f.end is not None and f.end <= self.t),
                   default=float("-inf"))

    def booted(self) -> float:
        """Simulated seconds at which the node last booted: 0, or the end of its latest reboot."""
        return max((f.end for f in self.fleet.faults_for(self.name)
                    if f.kind in REBOOTS and f.end is not None and f.end <= self.t), default=0.0)

    def boot_time(self) -> int:
        """Unix time the node last booted: its first boot, or the end of its latest reboot."""
        return int(self.started + self.booted())
