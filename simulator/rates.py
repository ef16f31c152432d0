"""Faults drawn at random from rates, so that a simulated fleet fails as often as a real one.

A fault-rates file gives each fault kind a rate per GPU-day, port-day or node-day and a duration:

    faults:
      - {cause: faulty GPU, kind: gpu_lost, per: gpu, rate: 1.673e-4, duration: 4h}
      - {cause: GPU system processor, kind: xid, xid: 119, per: gpu, rate: 1.92e-5, duration: 30m}

Each entry is a Poisson process over every GPU, InfiniBand port or node of the fleet: the time to the
next fault anywhere is exponential with the rate times the number of units, and the fault lands on a
unit drawn uniformly. The draw is seeded, so a run and the history written for a report agree, and
is made once up to a horizon (the simulator cannot know how long it will be left running).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.simulator.faults import KINDS, Fault, FaultKind, ScenarioError, listed, seconds

DAY = 86400.0
_FIELDS = {"cause", "kind", "per", "rate", "duration", "xid"}


@dataclass(frozen=True)
class Rate:
    cause: str  # What the entry stands for, in the words of the table it came from.
    kind: FaultKind
    per: str  # "gpu", "port" or "node": the unit the rate counts.
    per_day: float
    duration: float
    xid: int | None = None


def _unit(kind: FaultKind) -> str:
    """The unit a kind's rate is counted per: the target the kind needs."""
    needed, _ = KINDS[kind]
    return "gpu" if "gpu" in needed else "port" if "port" in needed else "node"


def _rate(raw: Any, what: str) -> Rate:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{what}: expected a mapping of fields, not {type(raw).__name__}")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ScenarioError(f"{what}: unknown field {unknown[0]!r}")
    for name in ("cause", "kind", "per", "rate", "duration"):
        if name not in raw:
            raise ScenarioError(f"{what}: needs {name!r}")
    try:
        kind = FaultKind(str(raw["kind"]))
    except ValueError:
        raise ScenarioError(f"{what}: kind {raw['kind']!r} is not one of {', '.join(sorted(KINDS))}") from None
    if raw["per"] != _unit(kind):
        raise ScenarioError(f"{what}: kind {kind} strikes one {_unit(kind)}, so its rate is per {_unit(kind)}, "
                            f"not per {raw['per']!r}")
    rate = raw["rate"]
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
        raise ScenarioError(f"{what}: rate must be a number of faults per {raw['per']}-day, at least 0, not {rate!r}")
    code = raw.get("xid")
    if (kind is FaultKind.XID) != (code is not None):
        raise ScenarioError(f"{what}: " + ("kind xid needs 'xid'" if code is None else f"kind {kind} takes no xid"))
    if code is not None and (isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 1000):
        raise ScenarioError(f"{what}: xid must be a whole number from 1 to 1000, not {code!r}")
    length = seconds(raw["duration"], f"{what}: duration")
    if length <= 0:
        raise ScenarioError(f"{what}: duration must be above 0")
    return Rate(str(raw["cause"]), kind, raw["per"], float(rate), length, code)


def load_rates(text: str) -> list[Rate]:
    """The entries of a fault-rates file, each checked, or ScenarioError naming the entry and field."""
    return [_rate(raw, f"rate {index + 1}") for index, raw in enumerate(listed(text, "faults", ScenarioError))]


def _units(per: str, nodes: Mapping[str, Sequence[str]], gpus_per_node: int) -> list[tuple[str, int | str | None]]:
    """(node, GPU index or InfiniBand port) of every unit a rate counts; nodes map to their ports."""
    if per == "gpu":
        return [(node, gpu) for node in nodes for gpu in range(gpus_per_node)]
    if per == "port":
        return [(node, port) for node, ports in nodes.items() for port in ports if "/" in port]
    return [(node, None) for node in nodes]


def draw(rates: Sequence[Rate], nodes: Mapping[str, Sequence[str]], gpus_per_node: int, horizon: float,
         seed: int, ids: itertools.count[int]) -> list[Fault]:
    """Every fault the rates give the fleet in [0, horizon) simulated seconds, in order of start."""
    rng = random.Random(f"fault-rates:{seed}")
    faults = []
    for rate in rates:
        units = _units(rate.per, nodes, gpus_per_node)
        per_second = rate.per_day * len(units) / DAY
        t = 0.0
        while per_second > 0:
            t += rng.expovariate(per_second)
            if t >= horizon:
                break
            node, target = units[rng.randrange(len(units))]
            faults.append(Fault(
                id=f"r{next(ids)}", kind=rate.kind, node=node, start=t, duration=rate.duration,
                gpu=target if isinstance(target, int) else None,
                port=target if isinstance(target, str) else None,
                link=rng.randrange(18) if "link" in KINDS[rate.kind][0] else None,
                xid=rate.xid, direction="tx" if rate.kind is FaultKind.NIC_SATURATION else None))
    return sorted(faults, key=lambda fault: fault.start)
