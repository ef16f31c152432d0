"""Faults the simulator can inject, and the scenario files and control-API bodies that describe them.

A fault is a kind, a target (node, and the GPU, NVLink or port where the kind
needs one), a start in simulated seconds and an optional duration. Kinds with a
size take it (a straggler's slowdown and cause, a saturated port's level, an
error counter's rate, a flap's period); left out, it is the size every test and
the simulator's docs describe. Parsing
checks everything up front and names the fault and field at fault, because a
scenario that silently does nothing is worse than one that refuses to load.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import yaml

from gpufleet import duration, xid
from gpufleet.simulator.kernel_log import MESSAGES


class FaultKind(StrEnum):
    """Every fault the simulator can inject; the simulator's code names kinds only through these members."""

    XID = "xid"
    ECC_DBE = "ecc_dbe"
    ECC_CONTAINED = "ecc_contained"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    GPU_LOST = "gpu_lost"
    GPU_DEAD = "gpu_dead"
    THERMAL_SLOWDOWN = "thermal_slowdown"
    POWER_BRAKE = "power_brake"
    PCIE_REPLAY_STORM = "pcie_replay_storm"
    PCIE_AER = "pcie_aer"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_CRC = "nvlink_crc"
    FABRIC_NOT_READY = "fabric_not_ready"
    FABRIC_DEGRADED = "fabric_degraded"
    STRAGGLER = "straggler"
    NIC_SATURATION = "nic_saturation"
    IB_CONGESTION = "ib_congestion"
    IB_LINK_DOWN = "ib_link_down"
    IB_LINK_FLAP = "ib_link_flap"
    IB_RATE_DEGRADED = "ib_rate_degraded"
    SYMBOL_ERRORS = "symbol_errors"
    EXPORTER_DOWN = "exporter_down"
    EXPORTER_RESTART = "exporter_restart"
    GPU_RESET = "gpu_reset"
    BOARD_RESET = "board_reset"
    NODE_REBOOT = "node_reboot"
    NODE_DOWN = "node_down"
    GPU_REPLACE = "gpu_replace"
    SWITCH_DOWN = "switch_down"
    GPU_REMOVED = "gpu_removed"
    JOB_HANG = "job_hang"
    DRIVER_MISMATCH = "driver_mismatch"
    ECC_DISABLED = "ecc_disabled"
    PERSISTENCE_OFF = "persistence_off"
    POWER_CAPPED = "power_capped"
    KERNEL_EVENTS = "kernel_events"
    DRIVER_HANG = "driver_hang"
    SXID_FATAL = "sxid_fatal"
    SXID_NONFATAL = "sxid_nonfatal"


OLDER_DRIVER = "570.124.06"  # What a driver_mismatch's node boots into, beside the simulated driver's 570.133.20.
# The XID each kind raises on its GPU when it starts, from the catalog the alerts class them by.
XIDS = {FaultKind.ECC_DBE: xid.DOUBLE_BIT_ECC, FaultKind.ECC_CONTAINED: xid.CONTAINED_ECC,
        FaultKind.ROW_REMAP_FAILURE: xid.ROW_REMAP_FAILURE,
        FaultKind.GPU_LOST: xid.FALLEN_OFF_BUS, FaultKind.GPU_DEAD: xid.FALLEN_OFF_BUS}
_XID_CLASSES = "; ".join(f"{name}: {', '.join(map(str, codes))}" for name, codes in xid.CLASSES.items())

# kind -> the target fields it needs, and a one-line description for errors, the landing page and the docs.
KINDS: dict[FaultKind, tuple[tuple[str, ...], str]] = {
    FaultKind.XID: (("gpu", "xid"), f"one XID event ({_XID_CLASSES})"),
    FaultKind.ECC_DBE: (("gpu",), f"a double-bit ECC error: uncorrected ECC counts rise, XID {xid.DOUBLE_BIT_ECC}"),
    FaultKind.ECC_CONTAINED: (("gpu",), "an uncorrectable memory error the GPU contains: uncorrected ECC counts rise, "
                                        f"XID {xid.CONTAINED_ECC}, a row remap waits for the next reset, and the "
                                        "driver asks for no recovery action (only the job that touched it is killed)"),
    FaultKind.ROW_REMAP_PENDING: (("gpu",), "a row remap waits for a GPU reset"),
    FaultKind.ROW_REMAP_FAILURE: (("gpu",), f"a row remap failed, XID {xid.ROW_REMAP_FAILURE}"),
    FaultKind.GPU_LOST: (("gpu",), f"the GPU falls off the bus: XID {xid.FALLEN_OFF_BUS}, then NVML reports it lost"),
    FaultKind.GPU_DEAD: (("gpu",), f"the GPU falls off the bus for good: XID {xid.FALLEN_OFF_BUS}, then NVML reports "
                                   "it lost through every reset and reboot until the fault ends (a board to reseat "
                                   "or replace)"),
    FaultKind.THERMAL_SLOWDOWN: (("gpu",), "SW and HW thermal slowdown: hot, clocks down, thermal violation time"),
    FaultKind.POWER_BRAKE: (("gpu",), "HW power brake: clocks and power halved"),
    FaultKind.PCIE_REPLAY_STORM: (("gpu",), "PCIe replays at `rate` per second (50)"),
    FaultKind.PCIE_AER: (("gpu",), "the GPU's PCIe link goes bad: one non-fatal uncorrectable error (a completion "
                                   "timeout) in its AER statistics at the start, then correctable errors at `rate` "
                                   "per second (1); the kernel's counts start again at the node's next boot"),
    FaultKind.NVLINK_DOWN: (("gpu", "link"), "one NVLink down: its traffic stops"),
    FaultKind.NVLINK_CRC: (("gpu", "link"), "NVLink CRC flit errors at `rate` per second (200)"),
    FaultKind.FABRIC_NOT_READY: (("gpu",), "the GPU's NVSwitch fabric registration restarts and stalls in progress "
                                           "until the fault ends or the GPU is reset"),
    FaultKind.FABRIC_DEGRADED: (("gpu",), "the GPU's NVSwitch fabric runs at limited capacity (degraded bandwidth) "
                                          "until the fault ends"),
    FaultKind.STRAGGLER: ((), "each training step of the node takes `slowdown` longer (0.4), for a `cause` (clock); "
                              "the other nodes of its job wait for it"),
    FaultKind.JOB_HANG: ((), "the job the node runs hangs (a collective that never completes): every GPU of every "
                             "node of the job busy to NVML (90 %) with SM activity at 6 % and no tensor activity; "
                             "with `xid`, the node's `gpu` (0) raises it first, as the node that failed"),
    FaultKind.NIC_SATURATION: (("port",), "a NIC port transmits (or receives) at `level` of link speed (0.97)"),
    FaultKind.IB_CONGESTION: (("port",), "port_xmit_wait rises by `rate` ticks per second (5 million)"),
    FaultKind.IB_LINK_DOWN: (("port",), "an InfiniBand port goes down: its traffic stops"),
    FaultKind.IB_LINK_FLAP: (("port",), "an InfiniBand port goes down for the first half of every `period` (20s)"),
    FaultKind.IB_RATE_DEGRADED: (("port",), "an InfiniBand port trains down to 200 Gb/s and stays up"),
    FaultKind.SYMBOL_ERRORS: (("port",), "symbol errors at `rate` per second (2)"),
    FaultKind.EXPORTER_DOWN: ((), "the node's endpoint stops answering"),
    FaultKind.EXPORTER_RESTART: ((), "the node's exporter restarts: scrapes are refused for the fault's duration, "
                                     "then a new process serves, its own counters from zero"),
    FaultKind.GPU_RESET: (("gpu",), "an operator resets the GPU: it leaves NVML for the fault's duration (5s), its "
                                    "volatile ECC counts clear and the driver asks for nothing more"),
    FaultKind.BOARD_RESET: ((), "an operator resets every GPU and NVSwitch of the board together, as a fatal SXid "
                                "needs: every GPU leaves NVML for the fault's duration (5s), as after a GPU reset"),
    FaultKind.NODE_REBOOT: ((), "an operator reboots the node: down for the fault's duration (60s), then a new boot "
                                "time, every GPU reset and back on the bus, a new exporter process"),
    FaultKind.NODE_DOWN: ((), "the node goes down unplanned (a kernel panic, its power or its network lost): "
                              "nothing of it answers, its probe port included, until the fault ends; then it "
                              "boots afresh, as after a reboot"),
    FaultKind.GPU_REPLACE: (("gpu",), "the board is replaced during a reboot of the node (60s): a new UUID at the "
                                      "same PCI address, with none of the old board's errors"),
    FaultKind.GPU_REMOVED: (("gpu",), "the GPU is taken out of the node on purpose, during a reboot (60s): "
                                      "afterwards NVML and the PCI bus list one GPU fewer"),
    FaultKind.DRIVER_MISMATCH: ((), f"the node is rebooted into an older driver ({OLDER_DRIVER}) than its peers': down "
                                    "for the fault's duration (60s), then every GPU reports that driver for good"),
    FaultKind.ECC_DISABLED: (("gpu",), "the GPU runs with ECC off, and will after its next reboot too"),
    FaultKind.PERSISTENCE_OFF: (("gpu",), "the GPU's persistence mode is off"),
    FaultKind.POWER_CAPPED: (("gpu",), "the GPU's power limit is set to `level` of its board's default (0.7)"),
    FaultKind.KERNEL_EVENTS: (("event",), "the node's kernel logs an `event` ({', '.join(MESSAGES)}) `rate` times "
                                          "a second (0.05)"),
    FaultKind.DRIVER_HANG: ((), f"the node's GPU driver hangs: its `gpu` (0) logs XID {xid.GSP_TIMEOUT} (a GSP "
                                "timeout) in the kernel log, and every NVML call blocks past the collector's timeout "
                                "until the fault ends, that GPU is reset or the node reboots"),
    FaultKind.SXID_FATAL: ((), "the node's first NVSwitch logs a fatal SXid (24007, a sourcetrack timeout on one "
                               "link) in the kernel log at the start: the board's NVLink fabric needs a reset"),
    FaultKind.SXID_NONFATAL: ((), "the node's first NVSwitch logs a non-fatal SXid (20001, a TX replay error) "
                                  "`rate` times a second (0.05)"),
    FaultKind.SWITCH_DOWN: (("leaf",), "a leaf switch goes down: its InfiniBand port (`port`, one rail) or every "
                                       "port of every node behind it (the `leaf` of --topology) goes down at once"),
}
# What an operator does to repair a node, rather than what breaks it: each takes a while (its duration, by
# default this long), during which the GPU or the node is away.
REPAIR_SECONDS = {FaultKind.GPU_RESET: 5.0, FaultKind.BOARD_RESET: 5.0, FaultKind.NODE_REBOOT: 60.0,
                  FaultKind.GPU_REPLACE: 60.0, FaultKind.GPU_REMOVED: 60.0, FaultKind.DRIVER_MISMATCH: 60.0}
# Kinds that reboot the node, and those during which its exporter does not answer, after which a new
# exporter process serves.
REBOOTS = frozenset({FaultKind.NODE_REBOOT, FaultKind.NODE_DOWN, FaultKind.GPU_REPLACE, FaultKind.GPU_REMOVED,
                     FaultKind.DRIVER_MISMATCH})
RESTARTS = frozenset({FaultKind.EXPORTER_RESTART, *REBOOTS})
_INFINIBAND = frozenset({FaultKind.IB_CONGESTION, FaultKind.IB_LINK_DOWN, FaultKind.IB_LINK_FLAP,
                         FaultKind.IB_RATE_DEGRADED, FaultKind.SYMBOL_ERRORS, FaultKind.SWITCH_DOWN})
# kind -> its size: the field that sets it, its default, and the largest value it takes (above 0).
SIZES: dict[FaultKind, tuple[str, float, float]] = {
    FaultKind.STRAGGLER: ("slowdown", 0.4, 4.0),
    FaultKind.NIC_SATURATION: ("level", 0.97, 1.0),
    FaultKind.POWER_CAPPED: ("level", 0.7, 1.0),
    FaultKind.KERNEL_EVENTS: ("rate", 0.05, 1e3),
    FaultKind.SXID_NONFATAL: ("rate", 0.05, 1e3),
    FaultKind.PCIE_REPLAY_STORM: ("rate", 50.0, 1e6),
    FaultKind.PCIE_AER: ("rate", 1.0, 1e6),
    FaultKind.NVLINK_CRC: ("rate", 200.0, 1e9),
    FaultKind.IB_CONGESTION: ("rate", 5e6, 1e9),
    FaultKind.SYMBOL_ERRORS: ("rate", 2.0, 1e6),
    FaultKind.IB_LINK_FLAP: ("period", 20.0, 86400.0),
}


class Cause(StrEnum):
    """Why a straggler is slow, which decides what its node's metrics show.

    `clock`: its clocks are capped with no reason reported (a bad board, clocks set low). `thermal` and
    `power`: capped by heat (software thermal slowdown, near the slowdown temperature) or by the power
    brake. `nic`: an InfiniBand port of the node is congested (its `port`, the first by default), so its
    collectives take longer. `pcie`: a GPU's PCIe link trained down to half width (its `gpu`, the
    first by default), and `host`: host-side stalls; in both, its GPUs idle between steps.
    """

    CLOCK = "clock"
    THERMAL = "thermal"
    POWER = "power"
    NIC = "nic"
    PCIE = "pcie"
    HOST = "host"


_FIELDS = {"kind", "node", "leaf", "gpu", "link", "port", "xid", "direction", "start", "duration", "id", "cause",
           "event", *(field for field, _, _ in SIZES.values())}


class ScenarioError(ValueError):
    """A fault description that cannot be used; the message names the fault and the field."""


def seconds(value: Any, what: str) -> float:
    """A scenario's start or duration in seconds, in gpufleet's one duration grammar (`90`, `90s`, `1h30m`)."""
    if not isinstance(value, str | int | float):
        raise ScenarioError(f"{what}: {value!r} is not a duration")
    try:
        return duration.parse(value)
    except duration.DurationError as err:
        raise ScenarioError(f"{what}: {err}") from None


@dataclass(frozen=True)
class Fault:
    id: str
    kind: FaultKind
    node: str
    start: float
    duration: float | None = None
    gpu: int | None = None
    link: int | None = None
    port: str | None = None  # "mlx5_0/1" for an InfiniBand port, "eth1" for an Ethernet interface.
    leaf: str | None = None  # A switch_down's leaf, whose nodes it takes down; its `node` is then "".
    xid: int | None = None
    direction: str | None = None  # "tx" or "rx", for nic_saturation.
    slowdown: float | None = None  # The sizes of SIZES; None is the kind's default (see `size`).
    level: float | None = None
    rate: float | None = None
    period: float | None = None
    cause: Cause | None = None  # A straggler's; None is `clock`.
    event: str | None = None  # A kernel_events fault's: what its kernel logs.

    def __post_init__(self) -> None:
        # A kind or cause given as text is checked here, so a misspelt one fails where it is written.
        object.__setattr__(self, "kind", FaultKind(self.kind))
        if self.cause is not None:
            object.__setattr__(self, "cause", Cause(self.cause))

    @property
    def size(self) -> float:
        """The kind's size, as given or by default: 0 for a kind that has none."""
        if self.kind not in SIZES:
            return 0.0
        field, default, _ = SIZES[self.kind]
        given = getattr(self, field)
        return default if given is None else float(given)

    @property
    def straggler_cause(self) -> Cause:
        return self.cause or Cause.CLOCK

    @property
    def end(self) -> float | None:
        return None if self.duration is None else self.start + self.duration

    def active(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, StrEnum) else v for k, v in asdict(self).items() if v is not None}


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
    try:
        kind = FaultKind(str(raw.get("kind")))
    except ValueError:
        raise ScenarioError(f"{what}: kind {raw.get('kind')!r} is not one of {', '.join(sorted(KINDS))}") from None
    node, leaf = _place(raw, what, kind, nodes)
    needed, _ = KINDS[kind]
    for name in needed:
        if name not in raw:
            raise ScenarioError(f"{what}: kind {kind} needs {name!r}")
    port = raw.get("port")
    ports = nodes[node].ports if node else next(n.ports for n in nodes.values() if getattr(n, "leaf", None) == leaf)
    if port is not None and port not in ports:
        raise ScenarioError(f"{what}: port {port!r} is not one of {', '.join(ports)}")
    if kind in _INFINIBAND and port is not None and "/" not in port:
        raise ScenarioError(f"{what}: kind {kind} needs an InfiniBand port (device/port), not {port!r}")
    saturation = kind is FaultKind.NIC_SATURATION
    direction = raw.get("direction", "tx" if saturation else None)
    if saturation and direction not in ("tx", "rx"):
        raise ScenarioError(f"{what}: direction must be tx or rx, not {direction!r}")
    if not saturation and direction is not None:
        raise ScenarioError(f"{what}: kind {kind} takes no direction")
    event = raw.get("event")
    if event is not None and (kind is not FaultKind.KERNEL_EVENTS or event not in MESSAGES):
        raise ScenarioError(f"{what}: " + (f"event must be one of {', '.join(MESSAGES)}, not {event!r}"
                                           if kind is FaultKind.KERNEL_EVENTS else f"kind {kind} takes no event"))
    if "xid" in raw and kind not in (FaultKind.XID, FaultKind.JOB_HANG):
        raise ScenarioError(f"{what}: kind {kind} takes no xid")
    sizes = _sizes(raw, what, kind)
    cause = raw.get("cause")
    if cause is not None and kind is not FaultKind.STRAGGLER:
        raise ScenarioError(f"{what}: kind {kind} takes no cause")
    if cause is not None and cause not in set(Cause):
        raise ScenarioError(f"{what}: cause must be one of {', '.join(Cause)}, not {cause!r}")
    if kind is FaultKind.STRAGGLER and port is not None and "/" not in port:
        raise ScenarioError(f"{what}: a straggler's port is the InfiniBand port (device/port) it congests")
    duration = raw.get("duration", REPAIR_SECONDS.get(kind))
    return Fault(
        id=str(raw.get("id", fault_id)),
        kind=kind,
        node=node,
        leaf=leaf,
        start=seconds(raw.get("start", 0), f"{what}: start"),
        duration=None if duration is None else seconds(duration, f"{what}: duration"),
        gpu=_integer(raw, "gpu", what, 0, gpus_per_node - 1),
        link=_integer(raw, "link", what, 0, 17),
        port=port,
        xid=_integer(raw, "xid", what, 1, 1000),
        direction=direction,
        cause=None if cause is None else Cause(cause),
        event=event,
        **sizes,
    )


def _place(raw: dict[str, Any], what: str, kind: FaultKind, nodes: dict[str, Any]) -> tuple[str, str | None]:
    """The fault's node, or for a switch_down its leaf (and no node): each checked against the fleet."""
    if kind is not FaultKind.SWITCH_DOWN:
        node = raw.get("node")
        if node not in nodes:
            raise ScenarioError(f"{what}: node {node!r} is not in the fleet")
        if "leaf" in raw:
            raise ScenarioError(f"{what}: kind {kind} takes a node, not a leaf")
        return node, None
    if "node" in raw:
        raise ScenarioError(f"{what}: a switch_down takes the leaf behind which its nodes are, not a node")
    leaves = sorted({n.leaf for n in nodes.values() if getattr(n, "leaf", None)})
    if raw.get("leaf") not in leaves:
        raise ScenarioError(f"{what}: leaf {raw.get('leaf')!r} is not one of the topology's "
                            f"({', '.join(leaves) or 'none: give the simulator --topology'})")
    return "", str(raw["leaf"])


def _sizes(raw: dict[str, Any], what: str, kind: FaultKind) -> dict[str, float]:
    """The size fields given, checked: only the kind's own, a number above 0 and at most its largest."""
    own = SIZES.get(kind)
    sizes = {}
    for field, _, _ in SIZES.values():
        if field not in raw:
            continue
        if own is None or own[0] != field:
            raise ScenarioError(f"{what}: kind {kind} takes no {field}")
        value = seconds(raw[field], f"{what}: {field}") if field == "period" else raw[field]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= own[2]:
            raise ScenarioError(f"{what}: {field} must be a number above 0 and at most {own[2]:g}, not {value!r}")
        sizes[field] = float(value)
    return sizes


def listed(text: str, key: str, error: type[ValueError], optional: bool = False) -> list[Any]:
    """The `key` list of a YAML file whose top level holds only that list (a layout's jobs, fault rates, a
    scenario's faults), or `error` saying what is wrong with the document. An `optional` list may be left
    out, and the document empty: a scenario without faults."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise error(f"not valid YAML: {err}") from None
    if document is None and optional:
        return []
    if not isinstance(document, dict) or not isinstance(document.get(key, [] if optional else None), list):
        raise error(f"expected a mapping with a '{key}' list")
    unknown = sorted(set(document) - {key})
    if unknown:
        raise error(f"unknown top-level key {unknown[0]!r}")
    return list(document.get(key, []))


def load_scenario(text: str, nodes: dict[str, Any], gpus_per_node: int, ids: itertools.count[int]) -> list[Fault]:
    """Faults from a scenario file: `faults: [ {kind: ..., node: ..., start: 2m, ...}, ... ]`."""
    return [parse_fault(raw, f"fault {index + 1}", f"f{next(ids)}", nodes, gpus_per_node)
            for index, raw in enumerate(listed(text, "faults", ScenarioError, optional=True))]
