"""The one configuration behind every rule: selectors, thresholds, `for` durations and runbook links."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    # Added to every selector, for example 'job="gpufleet"'; empty matches every target.
    selector: str = ""
    runbook_url: str = "https://github.com/gpufleet/gpufleet/blob/main/docs/runbooks.md#{anchor}"
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

    def metric(self, name: str, *matchers: str) -> str:
        """`name{selector,matchers}`, leaving out what is empty."""
        inner = ",".join(part for part in (self.selector, *matchers) if part)
        return f"{name}{{{inner}}}" if inner else name

    def runbook(self, alert: str) -> str:
        return self.runbook_url.format(anchor=alert.lower())
