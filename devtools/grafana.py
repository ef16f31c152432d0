"""The dashboards' queries as Grafana sends them to a data source: every target, with its variables expanded."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.devtools.net import http
from gpufleet.devtools.prom import query

_VARIABLE = re.compile(r"\$\{?(cluster|instance|gpu|job_id)\}?")
# The series of other exporters some panels read where the site scrapes them (blackbox_exporter's probe,
# ipmi_exporter's BMC sensors): gpufleet's exporters alone leave those panels empty.
_BESIDE = re.compile(r"\b(?:probe_success|ipmi_[a-z_]+)\{")


@dataclass(frozen=True)
class Target:
    """One query of one panel: `instant` for a table or stat that asks for one point; `interval` the panel's own
    minimum interval, where it sets one."""

    uid: str
    title: str
    expr: str
    instant: bool
    interval: str | None


def targets(directory: Path) -> list[Target]:
    """Every target of the dashboards written into `directory`, dashboard by dashboard."""
    return [Target(model["uid"], panel["title"], t["expr"], t.get("instant", False), panel.get("interval") or None)
            for path in sorted(directory.glob("*.json"))
            for model in [json.loads(path.read_text())] for panel in model["panels"] for t in panel.get("targets", [])]


def beside(found: Iterable[Target], exporter: str | None = None) -> list[Target]:
    """The targets that read another exporter's series (of `exporter`'s, a name prefix such as `ipmi_`, where
    given); the tests that run that exporter ask them."""
    return [t for t in found if (match := _BESIDE.search(t.expr)) and match[0].startswith(exporter or "")]


def ours(found: Iterable[Target]) -> list[Target]:
    """The targets that read only gpufleet's series, and what its rules record from them."""
    return [t for t in found if not _BESIDE.search(t.expr)]


def has_data(url: str, expr: str, instant: bool) -> bool:
    """What the panel would draw: an instant query for a table or stat, the last 5 minutes for a graph, so
    that a series that exists only around an event (a new ECC error) counts once it has been seen."""
    if instant:
        return bool(query(url, expr))
    end = time.time()
    params = urllib.parse.urlencode({"query": expr, "start": end - 300, "end": end, "step": 2})
    status, body = http("GET", f"{url}/api/v1/query_range?{params}")
    if status != 200:
        raise AssertionError(f"{expr}: {body!r}")
    return bool(json.loads(body)["data"]["result"])


def single_select(directory: Path) -> dict[str, set[str]]:
    """Per dashboard uid, the variables that take one value (the node dashboard's node), where All is no choice."""
    found: dict[str, set[str]] = {}
    for path in sorted(directory.glob("*.json")):
        model = json.loads(path.read_text())
        found[model["uid"]] = {v["name"] for v in model["templating"]["list"] if v["type"] == "query"
                               and not v["multi"]}
    return found


def expand(expr: str, scrape_seconds: int = 2, step: int | None = None, range_: str = "1m",
           values: Mapping[str, str] | None = None) -> str:
    """What Grafana sends: `$__interval` the step (one scrape by default), `$__rate_interval` as Grafana derives
    it (the larger of a step and a scrape, and four scrapes), `$__range`, and each variable its value in
    `values` or All (`.*`)."""
    step = step or scrape_seconds
    rate_interval = max(step + scrape_seconds, 4 * scrape_seconds)
    for name, value in (("$__rate_interval", f"{rate_interval}s"), ("$__interval_ms", str(step * 1000)),
                        ("$__interval", f"{step}s"), ("$__range", range_)):
        expr = expr.replace(name, value)
    chosen = values or {}
    return _VARIABLE.sub(lambda variable: chosen.get(variable[1], ".*"), expr)
