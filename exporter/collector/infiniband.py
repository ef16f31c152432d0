"""InfiniBand and RoCE ports from `<sysfs>/class/infiniband/<device>/ports/<port>/`.

Every file in `counters/` and `hw_counters/` is exported, named after the file,
so that a counter NVIDIA adds in a new driver appears without a code change.
Two traps are handled here rather than left to PromQL: the data counters count
4-byte words, not bytes, and the 32-bit `counters/` files saturate on busy
links, so the 64-bit `counters_ext/*_64` file is preferred where it exists.
"""

from __future__ import annotations

import re

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.sysfs import SysfsReader

_PORT_LABELS = ("device", "port")
_BYTES_PER_GIGABIT = 125_000_000
_WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})
_BYTES_PER_WORD = 4
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*(\d+)\s*:")
_COUNTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")
# hw_counters entries that are settings, not counters.
_HW_NOT_COUNTERS = frozenset({"lifespan"})


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


class InfinibandCollector(SysfsCollector):
    name = "infiniband"
    default_interval = 5.0

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        for device in sysfs.listdir("class/infiniband"):
            base = f"class/infiniband/{device}"
            families.gauge(
                "gpufleet_infiniband_info",
                "HCA metadata; the value is always 1.",
                ("device", "board_id", "firmware_version", "hca_type", "node_guid"),
            ).add_metric(
                [device] + [sysfs.text(f"{base}/{f}") or "" for f in ("board_id", "fw_ver", "hca_type", "node_guid")],
                1.0,
            )
            for port in sysfs.listdir(f"class/infiniband/{device}/ports"):
                self._collect_port(sysfs, families, device, port)

    def _collect_port(self, sysfs: SysfsReader, families: FamilySet, device: str, port: str) -> None:
        port_dir = f"class/infiniband/{device}/ports/{port}"
        labels = [device, port]

        rate = sysfs.text(f"{port_dir}/rate")
        if rate is not None:
            match = _RATE.match(rate)
            if match:
                families.gauge(
                    "gpufleet_infiniband_rate_bytes_per_second", "Port link rate.", _PORT_LABELS
                ).add_metric(labels, float(match.group(1)) * _BYTES_PER_GIGABIT)
            else:
                sysfs.problems.append(f"{port_dir}/rate: unrecognised rate {rate[:40]!r}")

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
                families.gauge(metric, documentation, _PORT_LABELS).add_metric(labels, float(match.group(1)))
            else:
                sysfs.problems.append(f"{port_dir}/{filename}: unrecognised state {text[:40]!r}")

        link_layer = sysfs.text(f"{port_dir}/link_layer")
        if link_layer is not None:
            families.gauge(
                "gpufleet_infiniband_port_info",
                "Port metadata; the value is always 1.",
                ("device", "port", "link_layer"),
            ).add_metric([*labels, link_layer], 1.0)

        for name, path in _counter_files(sysfs, port_dir).items():
            value = sysfs.counter(path)
            if value is None:
                continue
            metric = name.lower()
            if name in _WORD_COUNTERS:
                value *= _BYTES_PER_WORD
                metric += "_bytes"
            families.counter(
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
