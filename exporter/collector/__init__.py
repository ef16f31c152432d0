"""The collectors, one module each, sharing node_exporter's small interface.

A collector has a `name`, a `default_interval` in seconds and a blocking
`collect()` that reads the hardware and returns a `Collection`. The scheduler
runs `collect()` in a worker thread on the collector's own interval; collectors
never see the event loop, the HTTP server, or each other. `held()` is what a
collector serves without a collection of its own (before its first, and after
one that failed or timed out): what it keeps itself, never a stale reading. Collectors with
background work (the GPU collector's XID watchers) start it in `start()` and end
it in two steps, `stop()` then `close()`, so that a node, or a simulated fleet
of them, asks all of them to stop before it waits for any.

Which collectors a node runs, and the hardware they read, are decided in one
place: `exporter.node`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.sysfs import SysfsReader
from gpufleet.exporter.tree import Tree

_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


@dataclass(frozen=True)
class Collection:
    """What one collection produced.

    `problems` lists what could not be read this time (one line each). A
    collection with problems still serves the families it has, because a node
    with one unreadable sensor should keep reporting the rest; the collector's
    success metric says that something was missing.
    """

    families: tuple[Metric, ...]
    problems: tuple[str, ...] = ()


class CollectorError(Exception):
    """A collector cannot start with the flags it was given; the message says why."""


class Collector(Protocol):
    name: ClassVar[str]
    default_interval: ClassVar[float]

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        """Add the collector's own flags (beyond the common enable, interval and timeout)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> Collector:
        """Build the collector from parsed flags over the node's hardware; raises CollectorError on a bad
        combination. Nothing runs yet."""

    def start(self) -> None:
        """Start background work (event watchers); called once, before the first collection."""

    def collect(self) -> Collection: ...

    def held(self, hung: bool) -> Collection:
        """What to serve without a collection of its own: before the first, after one that raised, and after one
        that outlived its timeout (`hung`: the hardware did not answer), in the event loop's thread while that one
        may still be running. Only what the collector itself keeps (a GPU's held recovery action), never the
        hardware's last values."""

    def stop(self) -> None:
        """Ask background work to end, without waiting for it."""

    def close(self) -> None:
        """Wait for background work to end and release what the collector holds (NVML handles); called once."""


class FamilySet:
    """Metric families created on first use, in first-use order.

    Collectors whose series depend on what the hardware exposes (one family per
    InfiniBand counter file, say) add samples by name and let this keep one
    family per name, so a name is declared once however many devices report it.
    """

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
        return self._get(GaugeMetricFamily, name, documentation, labels)

    def counter(self, name: str, documentation: str, labels: Sequence[str]) -> CounterMetricFamily:
        return self._get(CounterMetricFamily, name, documentation, labels)

    def add(self, family: Metric) -> None:
        """A family built by the caller, for series whose label sets differ."""
        self._families[family.name] = family

    def _get(self, kind: type[_Family], name: str, documentation: str, labels: Sequence[str]) -> _Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = kind(name, documentation, labels=labels)
        assert isinstance(family, kind), f"{name} is already a {family.type}"
        return family

    def collection(self, problems: Sequence[str] = ()) -> Collection:
        """The families that received samples, with the problems met while filling them."""
        return Collection(tuple(f for f in self._families.values() if f.samples), tuple(problems))


class SysfsCollector:
    """Base for collectors that read only sysfs: they hold a tree, run nothing in the background, release nothing.

    `collect()` gives each collection a fresh reader, so the problems it reports
    are those of this collection only; subclasses fill the families in `read()`.
    """

    name: ClassVar[str]
    default_interval: ClassVar[float]

    def __init__(self, sysfs: Tree) -> None:
        self.sysfs = sysfs

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        return None

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> SysfsCollector:
        return cls(hardware.sysfs)

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def collect(self) -> Collection:
        sysfs = SysfsReader(self.sysfs)
        families = FamilySet()
        self.read(sysfs, families)
        return families.collection(sysfs.problems)

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        raise NotImplementedError

    def held(self, hung: bool) -> Collection:
        return Collection(())

    def close(self) -> None:
        return None
