"""Which GPUs the node had, by PCI address, kept across restarts and reboots: a repair is seen, not assumed.

A GPU that fell off the bus and is still gone after the reboot meant to fix it is in neither NVML's list nor,
often, the PCI bus's: only the exporter's memory says that a board sat in that slot. The inventory keeps every
GPU seen answering (UUID and the rest of its identity at each PCI address) in the state file, and a GPU it holds
that NVML no longer lists is reported lost (`gpufleet_gpu_up` 0) after a restart too, with its held recovery
action, until it answers again or a new board takes its slot. Nothing ages it out: a board taken out on purpose
is declared, by the node's expected GPU count (`--collector.gpu.expected-count`); once that many answer, the
GPUs still missing are forgotten and the node's smaller count is an inventory ticket, not a page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.exporter.gpu.session import GpuIdentity

_FIELDS = tuple(field.name for field in dataclasses.fields(GpuIdentity))


def _identity(entry: object) -> GpuIdentity | None:
    """One GPU as the state file keeps it; None where it does not parse."""
    if not isinstance(entry, dict) or set(entry) != set(_FIELDS):
        return None
    try:
        return GpuIdentity(int(str(entry["index"])), *(str(entry[name]) for name in _FIELDS[1:]))
    except ValueError:
        return None


class Inventory:
    """The GPUs a node has had, by PCI address, and the count it is declared to have."""

    def __init__(self, kept: object = None, expected: int | None = None) -> None:
        self.expected = expected
        self.gpus: dict[str, GpuIdentity] = {}
        self.ignored = 0  # Entries of the kept state that did not parse.
        for pci, entry in (kept.items() if isinstance(kept, Mapping) else ()):
            identity = _identity(entry)
            if identity is None or identity.pci_bus_id != pci:
                self.ignored += 1
            else:
                self.gpus[pci] = identity

    def missing(self, seen: Iterable[GpuIdentity]) -> tuple[GpuIdentity, ...]:
        """The GPUs the node had that are not among `seen` (those NVML answers for or knows lost), by index."""
        present = {identity.pci_bus_id for identity in seen}
        return tuple(sorted((g for pci, g in self.gpus.items() if pci not in present), key=lambda g: g.index))

    def settle(self, answering: Iterable[GpuIdentity]) -> list[GpuIdentity]:
        """Remember the GPUs answering now (a new board replaces the old one's entry), and, once the declared
        count of them answers, forget the missing ones: they were taken out on purpose. Returns those forgotten."""
        answering = list(answering)
        for identity in answering:
            self.gpus[identity.pci_bus_id] = identity
        if self.expected is None or len(answering) < self.expected:
            return []
        forgotten = list(self.missing(answering))
        for identity in forgotten:
            del self.gpus[identity.pci_bus_id]
        return forgotten

    def kept(self) -> dict[str, dict[str, Any]]:
        """The GPUs as the state file keeps them."""
        return {pci: dataclasses.asdict(identity) for pci, identity in sorted(self.gpus.items())}
