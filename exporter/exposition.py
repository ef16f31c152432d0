"""The /metrics body: every collector's latest output plus the exporter's own metrics.

The body is assembled on the first scrape after any collector's state changed,
and gzipped at most once per assembly, so other scrapes only hand out bytes
that already exist and any number of concurrent scrapers share them.
"""

from __future__ import annotations

import gzip
import platform
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpufleet import __version__
from gpufleet.exporter.render import render
from gpufleet.exporter.scheduler import CollectorState, ScheduledCollector
from gpufleet.exporter.state import PersistentState

_COLLECTOR = ("collector",)


def self_metrics(collectors: Sequence[ScheduledCollector]) -> list[Metric]:
    """node_exporter-style metrics about each collector, and the build of the exporter."""
    success = GaugeMetricFamily("gpufleet_collector_success", "1 when the collector's last collection read everything.",
                                labels=_COLLECTOR)
    duration = GaugeMetricFamily("gpufleet_collector_duration_seconds", "Duration of the collector's last collection.",
                                 labels=_COLLECTOR)
    last_success = GaugeMetricFamily("gpufleet_collector_last_success_timestamp_seconds",
                                     "Unix time of the collector's last successful collection.", labels=_COLLECTOR)
    skipped = CounterMetricFamily("gpufleet_collector_skipped_total",
                                  "Ticks skipped because the previous collection was still running.", labels=_COLLECTOR)
    for collector in collectors:
        state = collector.state
        success.add_metric([collector.name], 1.0 if state.success else 0.0)
        duration.add_metric([collector.name], state.duration_seconds)
        if state.last_success_timestamp is not None:
            last_success.add_metric([collector.name], state.last_success_timestamp)
        skipped.add_metric([collector.name], state.skipped)
    build = GaugeMetricFamily("gpufleet_exporter_build_info", "Build of the exporter; the value is always 1.",
                              labels=("version", "python_version"))
    build.add_metric([__version__, platform.python_version()], 1.0)
    return [f for f in (success, duration, last_success, skipped, build) if f.samples]


class Exposition:
    """`process` yields the process_* families; the simulator gives its nodes one shared, cached reading. `state`
    is the node's kept state, whose health the exporter reports beside its collectors'."""

    def __init__(self, collectors: Sequence[ScheduledCollector],
                 process: Callable[[], Iterable[Metric]] | None = None, state: PersistentState | None = None) -> None:
        self.collectors = collectors
        self._process = process or ProcessCollector(registry=None).collect
        self._state = state
        self._states: tuple[CollectorState, ...] | None = None
        self._body = b""
        self._gzipped: bytes | None = None

    def body(self) -> bytes:
        states = tuple(c.state for c in self.collectors)
        if self._states is None or any(a is not b for a, b in zip(states, self._states, strict=True)):
            kept = self._state.families() if self._state is not None else []
            own = render(self_metrics(self.collectors) + kept + list(self._process()))
            self._body = b"".join(state.body for state in states) + own
            self._gzipped = None
            self._states = states
        return self._body

    def gzipped(self) -> bytes:
        body = self.body()
        if self._gzipped is None:
            # Level 1: a third of level 6's time for a body about a quarter larger; scrapes are local networks.
            self._gzipped = gzip.compress(body, compresslevel=1, mtime=0)
        return self._gzipped
