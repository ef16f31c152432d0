"""The exporter itself: a target that cannot be scraped, a collector that fails or goes stale."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import alert


def exporter_health(c: Config) -> dict[str, Any]:
    up = c.up()
    rules = [
        alert(c, "NodeExporterDown", f"{up} == 0", "critical",
              "A gpufleet exporter cannot be scraped.",
              "Prometheus cannot scrape {{ $labels.instance }}: its GPUs, NICs and sensors are unobserved.",
              for_="5m", held=False),
        alert(c, "NodeCollectorFailing", f"{c.metric('gpufleet_collector_success')} == 0", "warning",
              "An exporter collector keeps failing.",
              "The {{ $labels.collector }} collector of {{ $labels.instance }} has failed for 10 minutes; "
              "its log says why.", for_="10m"),
        alert(c, "NodeCollectorStale",
              f"time() - {c.metric('gpufleet_collector_last_success_timestamp_seconds')} > "
              f"{max(1, round(c.stale_seconds / c.time_scale))}",
              "warning", "An exporter collector has not succeeded recently.",
              "The {{ $labels.collector }} collector of {{ $labels.instance }} last succeeded "
              "{{ $value | humanizeDuration }} ago."),
    ]
    return {"name": "gpufleet-exporter", "rules": rules}
