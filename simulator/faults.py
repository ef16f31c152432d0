"""Faults the simulator can inject, and the scenario files and control-API bodies that describe them.

A fault is a kind, a target (node, and the GPU, NVLink or port where the kind
needs one), a start in simulated seconds and an optional duration. Parsing
checks everything up front and names the fault and field at fault, because a
scenario that silently does nothing is worse than one that refuses to load.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass
from typing import Any

import yaml

# kind -> the target fields it needs, and a one-line description for errors and the README.
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "xid": (("gpu", "xid"), "one XID event (fatal: 48, 64, 79, 94, 95, 119; application: 13, 31, 43)"),
    "ecc_dbe": (("gpu",), "a double-bit ECC error: uncorrected ECC counts rise, XID 48"),
    "row_remap_pending": (("gpu",), "a row remap waits for a GPU reset"),
    "row_remap_failure": (("gpu",), "a row remap failed, XID 64"),
    "gpu_lost": (("gpu",), "the GPU falls off the bus: XID 79, then NVML reports it lost"),
    "thermal_slowdown": (("gpu",), "SW and HW thermal slowdown: hot, clocks down, thermal violation time"),
    "power_brake": (("gpu",), "HW power brake: clocks and power halved"),
    "pcie_replay_storm": (("gpu",), "PCIe replays at 50 per second"),
    "nvlink_down": (("gpu", "link"), "one NVLink down: its traffic stops"),
    "nvlink_crc": (("gpu", "link"), "NVLink CRC flit errors at 200 per second"),
    "straggler": ((), "the node computes 40% slower; the other nodes of its job wait for it"),
    "nic_saturation": (("port",), "a NIC port transmits (or receives) at 97% of link speed"),
    "ib_congestion": (("port",), "port_xmit_wait rises by 5 million ticks per second"),
    "ib_link_down": (("port",), "an InfiniBand port goes down: its traffic stops"),
    "ib_link_flap": (("port",), "an InfiniBand port goes down and up every 10 s"),
    "ib_rate_degraded": (("port",), "an InfiniBand port trains down to 200 Gb/s and stays up"),
    "symbol_errors": (("port",), "symbol errors at 2 per second"),
    "exporter_down": ((), "the node's endpoint stops answering"),
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_FIELDS = {"kind", "node", "gpu", "link", "port", "xid", "direction", "start", "duration", "id"}


class ScenarioError(ValueError):
    """A fault description that cannot be used; the message names the fault and the field."""


def seconds(value: Any, what: str) -> float:
    """`90`, `90s`, `1.5m`, `2h`, `500ms` -> seconds."""
    if isinstance(value, bool):
        raise ScenarioError(f"{what}: {value!r} is not a duration")
    if isinstance(value, (int, float)):
        result = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ScenarioError(f"{what}: {value!r} is not a duration (use for example 30s, 5m, 1h)")
        result = float(match.group(1)) * _UNITS[match.group(2)]
    if result < 0:
        raise ScenarioError(f"{what}: {value!r} is negative")
    return result


@dataclass(frozen=True)
class Fault:
    id: str
    kind: str
    node: str
    start: float
    duration: float | None = None
    gpu: int | None = None
    link: int | None = None
    port: str | None = None  # "mlx5_0/1" for an InfiniBand port, "eth1" for an Ethernet interface.
    xid: int | None = None
    direction: str | None = None  # "tx" or "rx", for nic_saturation.

    @property
    def end(self) -> float | None:
        return None if self.duration is None else self.start + self.duration

    def active(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _integer(raw: dict[str, Any], name: str, what: str, low: int, high: int) -> int | None:
    if name not in raw:
        return None
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ScenarioError(f"{what}: {name} must be a whole number from {low} to {high}, not {value!r}")
    return value


def parse_fault(raw: Any, what: str, fault_id: str, nodes: dict[str, Any], gpus_per_node: int) -> Fault:
    """One fault from a scenario entry or a control-API body, checked against the fleet."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{what}: expected a mapping of fields, not {type(raw).__name__}")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ScenarioError(f"{what}: unknown field {unknown[0]!r}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ScenarioError(f"{what}: kind {kind!r} is not one of {', '.join(sorted(KINDS))}")
    node = raw.get("node")
    if node not in nodes:
        raise ScenarioError(f"{what}: node {node!r} is not in the fleet")
    needed, _ = KINDS[kind]
    for name in needed:
        if name not in raw:
            raise ScenarioError(f"{what}: kind {kind} needs {name!r}")
    port = raw.get("port")
    if port is not None and port not in nodes[node].ports:
        raise ScenarioError(f"{what}: port {port!r} is not one of {', '.join(nodes[node].ports)}")
    if kind.startswith("ib_") and port is not None and "/" not in port:
        raise ScenarioError(f"{what}: kind {kind} needs an InfiniBand port (device/port), not {port!r}")
    direction = raw.get("direction", "tx" if kind == "nic_saturation" else None)
    if kind == "nic_saturation" and direction not in ("tx", "rx"):
        raise ScenarioError(f"{what}: direction must be tx or rx, not {direction!r}")
    if kind != "nic_saturation" and direction is not None:
        raise ScenarioError(f"{what}: kind {kind} takes no direction")
    duration = raw.get("duration")
    return Fault(
        id=str(raw.get("id", fault_id)),
        kind=kind,
        node=node,
        start=seconds(raw.get("start", 0), f"{what}: start"),
        duration=None if duration is None else seconds(duration, f"{what}: duration"),
        gpu=_integer(raw, "gpu", what, 0, gpus_per_node - 1),
        link=_integer(raw, "link", what, 0, 17),
        port=port,
        xid=_integer(raw, "xid", what, 1, 1000),
        direction=direction,
    )


def load_scenario(text: str, nodes: dict[str, Any], gpus_per_node: int, ids: itertools.count) -> list[Fault]:
    """Faults from a scenario file: `faults: [ {kind: ..., node: ..., start: 2m, ...}, ... ]`."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ScenarioError(f"not valid YAML: {err}") from None
    if document is None:
        return []
    if not isinstance(document, dict) or not isinstance(document.get("faults", []), list):
        raise ScenarioError("expected a mapping with a 'faults' list")
    unknown = sorted(set(document) - {"faults"})
    if unknown:
        raise ScenarioError(f"unknown top-level key {unknown[0]!r}")
    return [parse_fault(raw, f"fault {index + 1}", f"f{next(ids)}", nodes, gpus_per_node)
            for index, raw in enumerate(document.get("faults") or [])]
