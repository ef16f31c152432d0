"""InfiniBand and RoCE ports from `<sysfs>/class/infiniband/<device>/ports/<port>/`.

Every file in `counters/` and `hw_counters/` is exported, named after the file,
so that a counter NVIDIA adds in a new driver appears without a code change.
Two traps are handled here rather than left to PromQL: the data counters count
4-byte words, not bytes, and the 32-bit `counters/` files saturate on busy
links, so the 64-bit `counters_ext/*_64` file is preferred where it exists.

Beside node_exporter (`--collector.infiniband.beside-node-exporter`), what its infiniband collector exports
(the HCA's info, each port's state, rate and `counters/`) is read but not exported, so that no series is stored
twice: only what it lacks is, the `hw_counters/` (RoCE), each port's link layer and the two kept facts below.

Two facts a port's state and rate alone do not tell, kept in the exporter's state file so that a restart or
a reboot does not forget them: whether the port has ever been ACTIVE (a port that never was is uncabled, not
broken), and the rate it is known to reach (the fastest it has run at, or the fastest active port of the
same HCA model on the node), against which a degraded link is judged rather than against another HCA.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.state import PersistentState
from gpufleet.exporter.sysfs import SysfsReader
from gpufleet.exporter.tree import Tree
from gpufleet.flags import regex

_PORT_LABELS = ("device", "port")
_BYTES_PER_GIGABIT = 125_000_000
_WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})
_BYTES_PER_WORD = 4
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*(\d+)\s*:")
_ACTIVE = 4
_COUNTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")
# hw_counters entries that are settings, not counters.
_HW_NOT_COUNTERS = frozenset({"lifespan"})


# The IBA PortCounters' widths of the error counters, which the kernel reads with no 64-bit twin: each stops at
# its maximum rather than wrapping, until `perfquery -R` clears it, and its rate then reads 0 on the ports that
# fail most. A counter at its maximum is exported as such (`gpufleet_infiniband_port_counter_saturated`).
NARROW_COUNTERS = {
    "symbol_error": 16, "port_rcv_errors": 16, "port_rcv_remote_physical_errors": 16, "port_xmit_discards": 16,
    "VL15_dropped": 16, "link_downed": 8, "link_error_recovery": 8, "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4, "excessive_buffer_overrun_errors": 4,
}

# 64-bit `counters_ext/` files and the 32-bit `counters/` file each one replaces.
_EXTENDED = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}


def _counter_files(sysfs: SysfsReader, port_dir: str) -> dict[str, str]:
    """Counter name -> file, with the 64-bit `counters_ext/` file replacing its 32-bit twin."""
    files = {
        name: f"{port_dir}/counters/{name}"
        for name in sysfs.listdir(f"{port_dir}/counters")
        if _COUNTER_NAME.match(name)
    }
    for name in sysfs.listdir(f"{port_dir}/counters_ext"):
        if _COUNTER_NAME.match(name):
            files[_EXTENDED.get(name, name.removesuffix("_64"))] = f"{port_dir}/counters_ext/{name}"
    return files


def _saturated(name: str, path: str, value: float) -> bool:
    """Whether a counter read from `path` is a narrow error counter at its maximum. Exactly at it: a driver that
    reads a wider register for it shows larger values, and such a counter does not stop there."""
    width = NARROW_COUNTERS.get(name)
    return width is not None and path.endswith(f"/counters/{name}") and value == (1 << width) - 1


def _add_states(sysfs: SysfsReader, families: FamilySet, port_dir: str, labels: list[str]) -> float | None:
    """Export the port's logical and physical state; returns the logical one, where read."""
    read: dict[str, float] = {}
    for filename, metric, documentation in (
        ("state", "gpufleet_infiniband_state_id",
         "Logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)."),
        ("phys_state", "gpufleet_infiniband_physical_state_id",
         "Physical port state (2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery, 7 PhyTest)."),
    ):
        text = sysfs.text(f"{port_dir}/{filename}")
        if text is None:
            continue
        match = _STATE.match(text)
        if match:
            read[filename] = float(match.group(1))
            families.gauge(metric, documentation, _PORT_LABELS).add_metric(labels, read[filename])
        else:
            sysfs.problems.append(f"{port_dir}/{filename}: unrecognised state {text[:40]!r}")
    return read.get("state")


def _kept_ports(kept: object) -> dict[str, list[float]]:
    """The ports a previous process knew, as the state file keeps them; entries that do not parse are dropped."""
    if not isinstance(kept, dict):
        return {}
    return {str(key): [float(bool(value[0])), float(value[1])] for key, value in kept.items()
            if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)}


@dataclass
class _Port:
    """What one collection read of a port that the kept facts depend on."""

    device: str
    port: str
    key: str  # The HCA's GUID and the port: a new HCA in the same slot starts with nothing known.
    model: str
    active: bool
    rate: float | None


class InfinibandCollector(SysfsCollector):
    name = "infiniband"
    default_interval = 5.0

    def __init__(self, sysfs: Tree, include: re.Pattern[str] | None = None, exclude: re.Pattern[str] | None = None,
                 state: PersistentState | None = None, beside_node_exporter: bool = False) -> None:
        super().__init__(sysfs)
        self.beside_node_exporter = beside_node_exporter
        self.include = include
        self.exclude = exclude
        self.state = state or PersistentState()
        # Port key -> [1 once ACTIVE, fastest rate seen while ACTIVE in bytes per second].
        self.known = _kept_ports(self.state.section(self.name).get("ports"))

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        parser.add_argument("--collector.infiniband.device-include", dest="infiniband_device_include", type=regex,
                            metavar="REGEX", help="only HCAs whose name (mlx5_0) matches")
        parser.add_argument("--collector.infiniband.device-exclude", dest="infiniband_device_exclude", type=regex,
                            default="", metavar="REGEX",
                            help="leave out HCAs whose name matches, such as one not in use; empty keeps all "
                                 "(default: empty)")
        parser.add_argument("--collector.infiniband.beside-node-exporter", dest="infiniband_beside_node_exporter",
                            action="store_true",
                            help="export only what node_exporter's infiniband collector does not: hw_counters, "
                                 "link layers, and which ports have been ACTIVE and how fast (docs: "
                                 "exporter/node-exporter.md)")

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> InfinibandCollector:
        exclude = args.infiniband_device_exclude
        return cls(hardware.sysfs, args.infiniband_device_include, exclude if exclude.pattern else None,
                   hardware.state, args.infiniband_beside_node_exporter)

    def wanted(self, device: str) -> bool:
        if self.include is not None and not self.include.search(device):
            return False
        return self.exclude is None or not self.exclude.search(device)

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        ports: list[_Port] = []
        # Where node_exporter exports them, the info, states, rates and counters go to a set nobody reads.
        shared = FamilySet() if self.beside_node_exporter else families
        for device in sysfs.listdir("class/infiniband"):
            if not self.wanted(device):
                continue
            base = f"class/infiniband/{device}"
            info = {f: sysfs.text(f"{base}/{f}") or "" for f in ("board_id", "fw_ver", "hca_type", "node_guid")}
            shared.gauge(
                "gpufleet_infiniband_info",
                "HCA metadata; the value is always 1.",
                ("device", "board_id", "firmware_version", "hca_type", "node_guid"),
            ).add_metric([device, *info.values()], 1.0)
            for port in sysfs.listdir(f"class/infiniband/{device}/ports"):
                state, rate = self._collect_port(sysfs, families, shared, device, port)
                ports.append(_Port(device, port, f"{info['node_guid'] or device}/{port}",
                                   f"{info['hca_type']} {info['board_id']}", state == _ACTIVE, rate))
        self._add_known(ports, families)

    def _add_known(self, ports: list[_Port], families: FamilySet) -> None:
        """Remember which ports have been ACTIVE and how fast, and export both: whether each port has ever been
        ACTIVE, and the rate it is known to reach (its own fastest, or its same-model peers' fastest now)."""
        for port in ports:
            known = self.known.setdefault(port.key, [0.0, 0.0])
            if port.active:
                known[0] = 1.0
                known[1] = max(known[1], port.rate or 0.0)
        peers: dict[str, float] = {}
        for port in ports:
            if port.active and port.rate is not None:
                peers[port.model] = max(peers.get(port.model, 0.0), port.rate)
        seen = families.gauge("gpufleet_infiniband_port_seen_active",
                              "1 once the port has been ACTIVE (remembered across restarts with --path.state); 0 "
                              "for a port never seen up, such as one with no cable.", _PORT_LABELS)
        capability = families.gauge(
            "gpufleet_infiniband_rate_capability_bytes_per_second",
            "The rate the port is known to reach: the fastest it has run at, or the fastest active port of the "
            "same HCA model on the node now.", _PORT_LABELS)
        for port in ports:
            seen.add_metric([port.device, port.port], self.known[port.key][0])
            fastest = max(self.known[port.key][1], peers.get(port.model, 0.0))
            if fastest:
                capability.add_metric([port.device, port.port], fastest)
        self.state.update(self.name, {"ports": {key: [bool(v[0]), v[1]] for key, v in sorted(self.known.items())}})

    def _collect_port(self, sysfs: SysfsReader, families: FamilySet, shared: FamilySet, device: str,
                      port: str) -> tuple[float | None, float | None]:
        """Export one port's state, rate and counters (into `shared`, node_exporter's part) and its link layer
        and hardware counters; returns its logical state and rate, where read."""
        port_dir = f"class/infiniband/{device}/ports/{port}"
        labels = [device, port]
        speed = None

        rate = sysfs.text(f"{port_dir}/rate")
        if rate is not None:
            match = _RATE.match(rate)
            if match:
                speed = float(match.group(1)) * _BYTES_PER_GIGABIT
                shared.gauge(
                    "gpufleet_infiniband_rate_bytes_per_second", "Port link rate.", _PORT_LABELS
                ).add_metric(labels, speed)
            else:
                sysfs.problems.append(f"{port_dir}/rate: unrecognised rate {rate[:40]!r}")

        state = _add_states(sysfs, shared, port_dir, labels)

        link_layer = sysfs.text(f"{port_dir}/link_layer")
        if link_layer is not None:
            families.gauge(
                "gpufleet_infiniband_port_info",
                "Port metadata; the value is always 1.",
                ("device", "port", "link_layer"),
            ).add_metric([*labels, link_layer], 1.0)

        counters = _counter_files(sysfs, port_dir)
        if self.beside_node_exporter:  # node_exporter exports them; only whether a narrow one stopped is read here.
            counters = {name: path for name, path in counters.items() if name in NARROW_COUNTERS}
        for name, path in counters.items():
            value = sysfs.counter(path)
            if value is None:
                continue
            if _saturated(name, path, value):
                families.gauge("gpufleet_infiniband_port_counter_saturated",
                               "1 while a narrow error counter of the port sits at its maximum: it counts nothing "
                               "more until it is cleared (perfquery -R).", ("device", "port", "counter")).add_metric(
                    [*labels, name], 1.0)
            if self.beside_node_exporter:
                continue
            metric = name.lower()
            if name in _WORD_COUNTERS:
                value *= _BYTES_PER_WORD
                metric += "_bytes"
            shared.counter(
                f"gpufleet_infiniband_{metric}_total", f"Port counter {name}.", _PORT_LABELS
            ).add_metric(labels, value)

        for name in sysfs.listdir(f"{port_dir}/hw_counters"):
            if name in _HW_NOT_COUNTERS or not _COUNTER_NAME.match(name):
                continue
            value = sysfs.counter(f"{port_dir}/hw_counters/{name}")
            if value is not None:
                families.counter(
                    f"gpufleet_infiniband_hw_{name.lower()}_total", f"Port hardware counter {name}.", _PORT_LABELS
                ).add_metric(labels, value)
        return state, speed
