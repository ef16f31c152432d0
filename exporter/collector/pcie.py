"""PCIe Advanced Error Reporting counts for the links a GPU node's work runs over: its GPUs', NVSwitches' and
NICs', from `<sysfs>/bus/pci/devices/<address>/aer_dev_{correctable,nonfatal,fatal}`.

A link's errors are counted by whichever end saw them: the kernel's AER statistics are "as seen by the device",
so a bad endpoint often shows nothing itself while the switch or root port above it counts every error. Each
link is therefore one series per error type, the total of its device's functions and of the port directly above
them, labelled with both addresses and the slot the device sits in. Counting each end apart would double the
series a node serves for a distinction the runbook reads from sysfs in one command.

`bus/pci/devices/<address>` is a link into the device hierarchy (`devices/pci0000:17/0000:17:01.0/...`), which
is how the port above is found; where it is a plain directory (a tree without the hierarchy) the device's own
counts stand alone. The counts are kept by the kernel since boot, so a reboot starts them again. A device
without the AER capability has none of these files and is counted apart (with the port's counts still served
where it has them), so that a node whose devices cannot report is not taken for a node without errors. The
files exist wherever the capability does, though: where the firmware keeps AER to itself (firmware-first) the
kernel counts nothing, and the counts stay 0.

A sum of several files must never go down between two reboots, or a rate would read the step back up as new
errors: a link one of whose files cannot be read this time is left out of the collection, not served short.
SR-IOV virtual functions (a `physfn` link) share their device's link and are not counted again.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.pci import device_kind
from gpufleet.exporter.sysfs import SysfsReader

DEVICES = "bus/pci/devices"
# Error type -> the file that counts it and the line with its total.
TYPES = {"correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
         "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
         "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL")}
_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def device_path(sysfs: SysfsReader, address: str) -> str:
    """Where a PCI function's own directory is, below the tree's root: where its `bus/pci/devices` entry links
    to, or the entry itself where it is not a link (or links out of the tree)."""
    entry = f"{DEVICES}/{address}"
    target = sysfs.readlink(entry)
    if target is None:
        return entry
    resolved = posixpath.normpath(posixpath.join(DEVICES, target))
    return entry if resolved.startswith("..") or posixpath.isabs(resolved) else resolved


@dataclass
class _Link:
    """One device's functions and the port above them: what one set of series counts."""

    kind: str
    functions: list[str] = field(default_factory=list)  # Their directories.
    bridge: str = ""  # The port above: its directory, or "" at a root complex.


def _total(sysfs: SysfsReader, path: str, total: str) -> int | None:
    """The total line of one AER statistics file (each line an error's name and count); None where the file is
    absent, and a problem where it holds no readable total."""
    text = sysfs.text(path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if name == total:
            if count.isdigit():
                return int(count)
            break
    sysfs.problems.append(f"{path}: no {total} count")
    return None


class PcieCollector(SysfsCollector):
    name = "pcie"
    # The kernel keeps the counts; a ticket waits minutes for them, and a faster pass costs every node CPU.
    default_interval = 30.0

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        links = self._links(sysfs)
        slots = self._slots(sysfs)
        errors = families.counter("gpufleet_pcie_aer_errors_total",
                                  "PCIe errors the kernel's AER counted since boot on a device's link, at the device "
                                  "or at the port above it, by type.", ("address", "kind", "bridge", "slot", "type"))
        blind = 0
        for address, link in sorted(links.items()):
            problems = len(sysfs.problems)
            counts = {kind: [_total(sysfs, f"{where}/{file}", total)
                             for where in (*link.functions, *([link.bridge] if link.bridge else []))]
                      for kind, (file, total) in TYPES.items()}
            device_blind = all(value is None for values in counts.values() for value in values[:len(link.functions)])
            blind += device_blind
            if len(sysfs.problems) > problems or all(value is None for values in counts.values() for value in values):
                continue
            bridge = posixpath.basename(link.bridge)
            for kind, values in counts.items():
                errors.add_metric([address, link.kind, bridge, slots.get(address, ""), kind],
                                  sum(value for value in values if value is not None))
        families.gauge("gpufleet_pcie_links_without_aer", "GPU, NVSwitch and NIC links whose device has no AER "
                       "statistics (no AER capability): its own errors are not counted.",
                       ()).add_metric([], blind)

    @staticmethod
    def _links(sysfs: SysfsReader) -> dict[str, _Link]:
        """The GPU, NVSwitch and NIC devices on the bus, by their address without the function."""
        links: dict[str, _Link] = {}
        for address in sysfs.listdir(DEVICES):
            if not _ADDRESS.match(address):
                continue
            path = device_path(sysfs, address)
            kind = device_kind(sysfs, path)
            if kind is None or sysfs.readlink(f"{path}/physfn") is not None:
                continue
            link = links.setdefault(address.rpartition(".")[0], _Link(kind))
            link.functions.append(path)
            parent = posixpath.dirname(path)
            if _ADDRESS.match(posixpath.basename(parent)):
                link.bridge = parent
        return links

    @staticmethod
    def _slots(sysfs: SysfsReader) -> dict[str, str]:
        """Physical slot names by the address (without function) of the device in them, as the platform's
        firmware names them: the name printed on the board or in the server's manual."""
        slots = {}
        for name in sysfs.listdir("bus/pci/slots"):
            address = sysfs.text(f"bus/pci/slots/{name}/address")
            if address:
                slots[address] = name
        return slots
