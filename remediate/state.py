"""What the remediator remembers across restarts: the alerts it has seen, the nodes it holds, its drains of the
last hour, its breaker and the stated end of each node's last maintenance reservation, in one JSON file written
atomically after each change.

A file that cannot be read is moved aside (`<file>.corrupt`) with an error in the log, and the remediator starts
empty: it then takes back the nodes it drained from their Slurm reasons as their alerts come again, and the
breaker counts from zero, which the log says.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HOUR = 3600.0


@dataclass
class NodeRecord:
    """A node gpufleet wants out of service, or holds out.

    `phase`: `wanted` (an alert asks for a drain not done yet), `drained` (gpufleet drained it), `failed` (its
    check failed: it stays drained until an operator resumes it), `operator` (someone else had drained it: never
    touched). `alerts` maps each firing alert's fingerprint to its reason."""

    phase: str = "wanted"
    alerts: dict[str, str] = field(default_factory=dict)
    since: float = 0.0
    attempts: int = 0
    retry_at: float = 0.0
    why: str = ""  # A failed check's output, or the last Slurm error.


@dataclass
class Breaker:
    open: bool = False
    since: float = 0.0
    why: str = ""


@dataclass
class State:
    # Each alert's fingerprint: the start of its latest episode, and whether that episode resolved.
    alerts: dict[str, tuple[float, bool]] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    drains: list[tuple[float, str, list[str]]] = field(default_factory=list)  # When, node, its partitions.
    breaker: Breaker = field(default_factory=Breaker)
    # Each node still out of service since a maintenance reservation held it: that reservation's stated end. Slurm
    # forgets a reservation once it ends, which is when the end is needed.
    maintenance_ends: dict[str, float] = field(default_factory=dict)

    def recent_drains(self, now: float) -> list[tuple[float, str, list[str]]]:
        self.drains = [drain for drain in self.drains if drain[0] > now - HOUR]
        return self.drains

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "alerts": {k: list(v) for k, v in self.alerts.items()},
                "nodes": {name: asdict(record) for name, record in self.nodes.items()},
                "drains": [list(d) for d in self.drains], "breaker": asdict(self.breaker),
                "maintenance_ends": self.maintenance_ends}

    @classmethod
    def from_json(cls, raw: Any) -> State:
        if not isinstance(raw, dict) or raw.get("version") != 1:
            raise ValueError("not a gpufleet remediate state (version 1)")
        return cls(alerts={k: (float(v[0]), bool(v[1])) for k, v in raw["alerts"].items()},
                   nodes={name: NodeRecord(**record) for name, record in raw["nodes"].items()},
                   drains=[(float(t), str(n), [str(p) for p in parts]) for t, n, parts in raw["drains"]],
                   breaker=Breaker(**raw["breaker"]),
                   maintenance_ends={str(k): float(v) for k, v in raw.get("maintenance_ends", {}).items()})


class StateFile:
    """`State` kept in `path` (none: in memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._written = ""  # What the file holds: a pass that changed nothing writes nothing.

    def load(self) -> State:
        if self.path is None or not self.path.exists():
            return State()
        try:
            return State.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.error("state file %s unreadable (%s): moved to %s; starting empty, the breaker's hour from zero",
                      self.path, err, aside)
            os.replace(self.path, aside)
            return State()

    def save(self, state: State) -> None:
        text = json.dumps(state.to_json())
        if self.path is None or text == self._written:
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, self.path)
        self._written = text
