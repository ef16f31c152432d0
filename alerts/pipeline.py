"""The alerting pipeline's own health: an alert that always fires, so that a heartbeat service outside the
cluster pages when it stops hearing it (Prometheus, its rules or Alertmanager are down, or the path between
them is); and Alertmanager failing to deliver, which would otherwise lose pages and tickets without a trace."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import TREND_INTERVAL, alert

WATCHDOG = "Watchdog"  # Always firing, by design: the tests' logs of alerts leave it out (devtools.delivery).
WATCHDOG_SEVERITY = "none"  # Routed by its name alone; the only alert outside critical, warning and info.
# The share of an integration's notifications that may fail over the window before it alerts: a single retry
# that then succeeded is not an outage.
FAILED_SHARE = 0.01


def pipeline(c: Config) -> dict[str, Any]:
    # Alertmanager's own series: the selector picks the exporters', not these.
    job = f'{{job="{c.alertmanager_job}"}}'
    failed = f"rate(alertmanager_notifications_failed_total{job}[{c.d('5m')}])"
    sent = f"rate(alertmanager_notifications_total{job}[{c.d('5m')}])"
    rules = [
        # Routed to the heartbeat receiver, never to a person (compose/alertmanager/alertmanager.yml). Severity
        # `none`, as kube-prometheus-stack's own: its Alertmanager mutes `info` alerts (InfoInhibitor) while no
        # warning fires, and a muted Watchdog would page through the heartbeat service on a healthy fleet.
        alert(c, WATCHDOG, "vector(1)", WATCHDOG_SEVERITY,
              "Always firing: proves to the heartbeat service that the alerting pipeline works.",
              "This alert fires always, through every part of the pipeline, and reaches the heartbeat receiver "
              "once a minute. The heartbeat service pages when it stops arriving.", held=False),
        alert(c, "AlertmanagerNotificationsFailed",
              f"sum by ({c.by('instance', 'integration')}) ({failed}) / "
              f"sum by ({c.by('instance', 'integration')}) ({sent}) > {FAILED_SHARE:g}", "critical",
              "Alertmanager fails to deliver notifications: pages or tickets are being lost.",
              "Alertmanager {{ $labels.instance }} failed {{ $value | humanizePercentage }} of its "
              "{{ $labels.integration }} notifications over 5 minutes.", for_="5m", held=False),
    ]
    return {"name": "gpufleet-pipeline", "interval": c.d(TREND_INTERVAL), "rules": rules}
