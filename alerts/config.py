"""The one configuration behind every rule: selectors, thresholds, `for` durations and runbook links."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpufleet import duration


@dataclass(frozen=True)
class Config:
    # Added to every selector, for example 'job="gpufleet"'; empty matches every target.
    selector: str = ""
    # The scrape job of the exporters: `up` of other jobs (Prometheus itself, Alertmanager) is not ours.
    exporter_job: str = "gpufleet"
    runbook_url: str = "https://github.com/gpufleet/gpufleet/blob/main/docs/runbooks.md#{anchor}"
    # Every window and `for` duration is divided by this. Only the end-to-end test sets it, so that
    # alerts meant to wait ten minutes wait seconds; the committed file is generated at 1.
    time_scale: float = 1.0

    xid_window: str = "15m"  # How long an XID event keeps its alert firing.
    repeat_window: str = "1h"  # An application XID seen again within this window is a repeat.
    ecc_window: str = "15m"
    gpu_count_lookback: str = "1d"
    pcie_replays_per_minute: float = 8.0  # Above DCGM's recommended limit.
    nvlink_crc_per_second: float = 100.0  # DCGM's limit.
    slowdown_share: float = 0.1  # Share of samples with a hardware slowdown reason active.
    slowdown_window: str = "10m"
    thermal_margin_celsius: float = 2.0  # NVSentinel flags H100s below about 2 °C of margin.
    retired_pages_critical: int = 60  # DCGM: 60+ retired pages is an RMA candidate on pre-Ampere GPUs.
    stale_seconds: int = 300  # A collector without a success for this long is stale.

    # Stragglers: a node is one when both tests agree, for `straggler_for`, in a job of enough nodes.
    signal_window: str = "5m"  # Per-node signals are averaged over this, to see through training phases.
    straggler_for: str = "10m"
    straggler_min_nodes: int = 4
    straggler_relative: float = 0.75  # Score against the job's best node (nvidia-resiliency-ext's default).
    straggler_zscore: float = -3.5  # Modified z-score from median and MAD (Iglewicz and Hoaglin).
    busy_utilization: float = 0.5  # Nodes with no job are compared only while their GPUs are this busy.

    # Network and fabric.
    saturation_warning: float = 0.8  # Share of link speed.
    saturation_critical: float = 0.95  # With a training job on the node.
    # Utilisation is averaged over this window before the thresholds apply: a rate over a snapshot
    # exporter's counters wobbles by the collection interval over the rate window (±5% at 15 s over
    # 5 m), enough to drop a port at 97% below 95% now and then, restarting `for`.
    saturation_window: str = "10m"
    saturation_for: str = "5m"
    # port_xmit_wait ticks per second. The tick differs by HCA, so tune this to your fabric; below it,
    # a port is still flagged when its node waits `xmit_wait_outlier` times more than its job's median.
    xmit_wait_per_second: float = 10e6
    xmit_wait_outlier: float = 4.0
    link_downed_window: str = "15m"
    link_flaps: int = 2  # More link-downs than this in the window is a flapping link.
    symbol_errors_per_hour: int = 120  # NVSentinel.
    link_error_recoveries_per_minute: float = 5.0  # NVSentinel.
    receive_errors_per_second: float = 10.0  # NVSentinel.
    transmit_discards_per_second: float = 100.0  # NVSentinel.
    roce_out_of_buffer_per_second: float = 100.0
    roce_slow_restarts_per_second: float = 1.0
    ethernet_error_share: float = 0.01  # Errors per packet, as kube-prometheus.

    def metric(self, name: str, *matchers: str) -> str:
        """`name{selector,matchers}`, leaving out what is empty."""
        inner = ",".join(part for part in (self.selector, *matchers) if part)
        return f"{name}{{{inner}}}" if inner else name

    def runbook(self, alert: str) -> str:
        return self.runbook_url.format(anchor=alert.lower())

    def d(self, window: str) -> str:
        """A window or `for` duration after the time scale; unchanged at scale 1, so the file reads naturally."""
        seconds = duration.parse(window)  # Refused here, not by Prometheus, when it is not a duration.
        if self.time_scale == 1:
            return window
        return duration.render(max(1, round(seconds / self.time_scale)))

    def scaled(self, time_scale: float) -> Config:
        return dataclasses.replace(self, time_scale=time_scale)
