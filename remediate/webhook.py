"""Alertmanager's webhook body (version 4), checked whole before anything acts on it.

A body that is not Alertmanager's, or that holds one alert gpufleet cannot act on (no `remediation` label, an
action it does not know, no node), is refused as a whole: nothing in it is acted on, so a malformed or
misrouted message can never drain a node by mistake.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# What each `remediation` label asks for. Every one drains the node until the GPU's alert resolves.
ACTIONS = frozenset({"drain"})
_FRACTION = re.compile(r"(\.\d{6})\d+")  # Go writes nanoseconds; Python reads microseconds.


class Refused(ValueError):
    """The body cannot be acted on; `kind` is the self-metric's result (`malformed`, `unknown_alert`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Alert:
    """One alert of the body, as far as a remediation needs it."""

    fingerprint: str
    firing: bool
    name: str
    node: str
    starts_at: float  # Unix seconds: an episode of one alert is its fingerprint and its start.
    reason: str  # Written into the node's drain reason.
    labels: dict[str, str]


def _time(text: Any, where: str) -> float:
    if not isinstance(text, str):
        raise Refused("malformed", f"{where}: startsAt must be a timestamp")
    try:
        return datetime.fromisoformat(_FRACTION.sub(r"\1", text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise Refused("malformed", f"{where}: startsAt {text[:40]!r} is not an RFC 3339 time") from None


def _strings(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Refused("malformed", f"{what} must map names to strings")
    return value


def parse(body: Any, node_label: str, node_pattern: re.Pattern[str]) -> list[Alert]:
    """The body's alerts; `node_pattern`'s `node` group, searched in the `node_label` label, is the Slurm node."""
    if not isinstance(body, dict) or body.get("version") != "4" or not isinstance(body.get("alerts"), list):
        raise Refused("malformed", "not an Alertmanager webhook (version 4 with a list of alerts)")
    alerts = []
    for number, raw in enumerate(body["alerts"]):
        where = f"alert {number}"
        if not isinstance(raw, dict) or raw.get("status") not in ("firing", "resolved"):
            raise Refused("malformed", f"{where}: status must be firing or resolved")
        labels = _strings(raw.get("labels"), f"{where}: labels")
        annotations = _strings(raw.get("annotations", {}), f"{where}: annotations")
        name = labels.get("alertname", "")
        where = f"{where} ({name or 'no alertname'})"
        if labels.get("remediation") not in ACTIONS:
            raise Refused("unknown_alert", f"{where}: remediation label {labels.get('remediation')!r} is not one "
                                           f"of {', '.join(sorted(ACTIONS))}; route only such alerts here")
        found = node_pattern.search(labels.get(node_label, ""))
        if found is None or not found.group("node"):
            raise Refused("unknown_alert", f"{where}: no node in its {node_label!r} label")
        fingerprint = raw.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise Refused("malformed", f"{where}: no fingerprint")
        reason = annotations.get("remediation_reason") or f"{name} on GPU {labels.get('gpu', '?')}"
        alerts.append(Alert(fingerprint, raw["status"] == "firing", name, found.group("node"),
                            _time(raw.get("startsAt"), where), " ".join(reason.split())[:200], labels))
    return alerts
