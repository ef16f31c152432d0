"""Ethernet (and any other netdev) statistics from `<sysfs>/class/net/<device>/`.

The kernel keeps these counters per interface in sysfs, so reading them costs a
handful of small file reads and no netlink or ethtool ioctls. Virtual devices
(container veths, bridges, loopback) are left out by default because on a GPU
node they multiply series without saying anything about the fabric.
"""

from __future__ import annotations

import argparse
import re

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.sysfs import SysfsReader
from gpufleet.exporter.tree import Tree
from gpufleet.flags import regex

DEFAULT_DEVICE_EXCLUDE = (
    r"^(lo|veth.*|docker\d*|br-.*|virbr\d*|cni\d*|cbr\d*|kube-bridge|flannel\..*|cali.*|tunl\d*|ifb\d*|dummy\d*)$"
)

_LABELS = ("device",)
_BYTES_PER_MEGABIT = 125_000
_STATISTIC_NAME = re.compile(r"^[a-z0-9_]+$")
_DIRECTIONS = {"rx": "receive", "tx": "transmit"}


def _statistic_metric(filename: str) -> str:
    """`rx_bytes` -> `gpufleet_network_receive_bytes_total`, as node_exporter names them."""
    direction, _, rest = filename.partition("_")
    if direction in _DIRECTIONS and rest:
        filename = f"{_DIRECTIONS[direction]}_{rest}"
    return f"gpufleet_network_{filename}_total"


class NetworkCollector(SysfsCollector):
    name = "network"
    default_interval = 5.0

    def __init__(self, sysfs: Tree, include: re.Pattern[str] | None = None,
                 exclude: re.Pattern[str] | None = re.compile(DEFAULT_DEVICE_EXCLUDE)) -> None:
        super().__init__(sysfs)
        self.include = include
        self.exclude = exclude

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        parser.add_argument("--collector.network.device-include", dest="network_device_include", type=regex,
                            metavar="REGEX", help="only interfaces whose name matches")
        parser.add_argument("--collector.network.device-exclude", dest="network_device_exclude", type=regex,
                            default=DEFAULT_DEVICE_EXCLUDE, metavar="REGEX",
                            help="leave out interfaces whose name matches; empty keeps all (default: %(default)s)")

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> NetworkCollector:
        exclude = args.network_device_exclude
        return cls(hardware.sysfs, args.network_device_include, exclude if exclude.pattern else None)

    def wanted(self, device: str) -> bool:
        if self.include is not None and not self.include.search(device):
            return False
        return self.exclude is None or not self.exclude.search(device)

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        for device in sysfs.listdir("class/net"):
            if self.wanted(device):
                self._collect_device(sysfs, families, device)

    def _collect_device(self, sysfs: SysfsReader, families: FamilySet, device: str) -> None:
        base = f"class/net/{device}"
        labels = [device]
        for filename in sysfs.listdir(f"class/net/{device}/statistics"):
            if not _STATISTIC_NAME.match(filename):
                continue
            value = sysfs.counter(f"{base}/statistics/{filename}")
            if value is not None:
                families.counter(
                    _statistic_metric(filename),
                    f"Interface statistic {filename} from sysfs.",
                    _LABELS,
                ).add_metric(labels, value)

        operstate = sysfs.text(f"{base}/operstate")
        if operstate is not None:
            families.gauge(
                "gpufleet_network_up", "1 when the interface's operstate is up, else 0.", _LABELS
            ).add_metric(labels, 1.0 if operstate == "up" else 0.0)
            families.gauge(
                "gpufleet_network_info",
                "Interface metadata; the value is always 1.",
                ("device", "address", "operstate", "duplex"),
            ).add_metric(
                [device, sysfs.text(f"{base}/address") or "", operstate, sysfs.text(f"{base}/duplex") or ""], 1.0
            )

        # A link that is down, or a virtual device, reports -1 or EINVAL: no speed rather than a negative one.
        speed = sysfs.integer(f"{base}/speed")
        if speed is not None and speed > 0:
            families.gauge(
                "gpufleet_network_speed_bytes_per_second", "Negotiated link speed.", _LABELS
            ).add_metric(labels, float(speed * _BYTES_PER_MEGABIT))

        carrier_changes = sysfs.counter(f"{base}/carrier_changes")
        if carrier_changes is not None:
            families.counter(
                "gpufleet_network_carrier_changes_total", "Times the link carrier went up or down.", _LABELS
            ).add_metric(labels, carrier_changes)

        mtu = sysfs.integer(f"{base}/mtu")
        if mtu is not None:
            families.gauge("gpufleet_network_mtu_bytes", "Interface MTU.", _LABELS).add_metric(labels, mtu)
