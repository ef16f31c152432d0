"""The shape of one rule, shared by every group module."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config

# How a GPU is named in descriptions: index, UUID (what nvidia-smi and RMA forms use) and node.
GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
PORT = "{{ $labels.device }} port {{ $labels.port }} of {{ $labels.instance }}"
# The interval of every group that judges five minutes or more of data (and of what those groups read):
# evaluating a 5-minute rate or a 10-minute `for` every 15 s finds nothing sooner that matters, and at a
# thousand nodes it costs four times the CPU. Groups without an interval run at the scrape interval.
TREND_INTERVAL = "1m"


def alert(config: Config, name: str, expr: str, severity: str, summary: str, description: str,
          for_: str | None = None) -> dict[str, Any]:
    """An alerting rule with the annotations every gpufleet alert carries; `for_` goes through the time scale."""
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = config.d(for_)
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description, "runbook_url": config.runbook(name)}
    return rule


def record(name: str, expr: str, **labels: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule
