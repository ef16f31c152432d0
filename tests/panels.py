"""The dashboards' queries, as Grafana would send them to a data source."""

from __future__ import annotations

import json
import re
from pathlib import Path


def built(directory: Path) -> list[tuple[str, str, str, bool]]:
    """(uid, panel title, expression, instant) of every target of the dashboards written into `directory`."""
    return [(model["uid"], panel["title"], t["expr"], t.get("instant", False))
            for path in sorted(directory.glob("*.json"))
            for model in [json.loads(path.read_text())] for panel in model["panels"] for t in panel["targets"]]


def expand(expr: str, scrape_seconds: int = 2) -> str:
    """What Grafana sends with every variable at All, an interval of one scrape and a rate interval of four."""
    for name, value in (("$__rate_interval", f"{4 * scrape_seconds}s"), ("$__interval_ms", f"{scrape_seconds}000"),
                        ("$__interval", f"{scrape_seconds}s"), ("$__range", "1m")):
        expr = expr.replace(name, value)
    return re.sub(r"\$\{?(cluster|instance|gpu|job_id)\}?", ".*", expr)
