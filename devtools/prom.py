"""Asking Prometheus-compatible servers (Prometheus, VictoriaMetrics, vmagent, vmalert) what they hold."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools.net import get, http
from gpufleet.devtools.waiting import HarnessError

QUERY_STEP = "300s"  # vmalert's -datasource.queryStep default, which the compose file keeps.


def query(url: str, promql: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The result of an instant query now; a server that refuses it raises a HarnessError."""
    status, body = http("GET", f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=timeout)
    if status != 200:
        raise HarnessError(f"query {promql!r} answered {status}: {body[:500]!r}")
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


def query_value(url: str, promql: str, timeout: float = 10.0) -> float | None:
    """The first value of an instant query, or None when it returns nothing."""
    result = query(url, promql, timeout)
    return float(result[0]["value"][1]) if result else None


def own_metrics(url: str, timeout: float = 60.0,
                key: Callable[[str, dict[str, str]], str | None] = lambda _name, _labels: None
                ) -> dict[tuple[str, str], float]:
    """(metric, key) -> value summed over the samples of a program's own /metrics, which needs nothing to scrape
    it; `key` picks the label that tells samples apart (a rule group, say), or None to sum them all."""
    values: dict[tuple[str, str], float] = defaultdict(float)
    for family in text_string_to_metric_families(get(f"{url}/metrics", timeout).decode()):
        for sample in family.samples:
            values[(sample.name, key(sample.name, sample.labels) or "")] += sample.value
    return dict(values)


def own_metric(url: str, name: str, timeout: float = 60.0, **labels: str) -> float:
    """The sum of one of a program's own metrics over the samples that carry `labels`."""
    return sum(sample.value for family in text_string_to_metric_families(get(f"{url}/metrics", timeout).decode())
               for sample in family.samples if sample.name == name and labels.items() <= sample.labels.items())


def scraped_instances(agent: str, job: str = "gpufleet") -> set[str]:
    """The `instance` of every target of the scrape `job` that a vmagent (or Prometheus) scrapes."""
    status, body = http("GET", f"{agent}/api/v1/targets")
    if status != 200:
        raise HarnessError(f"{agent} listed no targets: {status} {body[:500]!r}")
    return {target["labels"]["instance"] for target in json.loads(body)["data"]["activeTargets"]
            if target["labels"].get("job") == job}


class VmalertIterations:
    """Each rule group's evaluations in a running vmalert, from the sums and counts of its own
    `vmalert_iteration_duration_seconds`: vmalert keeps no last duration per group as Prometheus does, and
    its summary's quantiles cover a sliding window. Read more often than the shortest interval, each new
    count is one evaluation and the sum's step its duration, ended by the time of the read (`ended`, the
    clock's seconds, within one read's period)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.durations: dict[str, list[float]] = {}
        self.ended: dict[str, list[float]] = {}
        self.first = self.last = self._totals()

    def _totals(self) -> dict[tuple[str, str], float]:
        def group(name: str, labels: dict[str, str]) -> str | None:
            return labels.get("group") if name.startswith("vmalert_") else None

        return {key: value for key, value in own_metrics(self.url, 30, group).items()
                if key[0].startswith(("vmalert_iteration_", "vmalert_execution_errors_total"))}

    def sample(self) -> None:
        now, at = self._totals(), time.time()
        for (name, group), count in now.items():
            if name == "vmalert_iteration_duration_seconds_count" and group:
                runs = count - self.last.get((name, group), 0.0)
                spent = now[("vmalert_iteration_duration_seconds_sum", group)] - self.last.get(
                    ("vmalert_iteration_duration_seconds_sum", group), 0.0)
                if runs > 0:
                    self.durations.setdefault(group, []).extend([spent / runs] * int(runs))
                    self.ended.setdefault(group, []).extend([at] * int(runs))
        self.last = now

    def since_start(self, name: str, group: str = "") -> float:
        """How much a counter of vmalert's (missed iterations, failed executions) grew while it was sampled."""
        return self.last.get((name, group), 0.0) - self.first.get((name, group), 0.0)


def rule_times(url: str, groups: dict[str, Any], at: float, runs: int = 3) -> list[tuple[float, str, str]]:
    """Each rule's median query time at `at`, slowest first, with its group and name: its expression asked
    as vmalert asks it (an instant query with vmalert's step), which says where a group's time goes."""
    times = []
    for group in groups["groups"]:
        for rule in group["rules"]:
            params = urllib.parse.urlencode({"query": rule["expr"], "time": f"{at:.0f}", "step": QUERY_STEP})
            seen = []
            for _ in range(runs):
                began = time.monotonic()
                get(f"{url}/api/v1/query?{params}", 120)
                seen.append(time.monotonic() - began)
            if "record" in rule:  # A recording rule's labels tell its rules apart (a cause, a signal).
                labels = ",".join(f'{k}="{v}"' for k, v in rule.get("labels", {}).items())
                name = rule["record"] + (f"{{{labels}}}" if labels else "")
            else:
                name = rule["alert"]
            times.append((sorted(seen)[runs // 2], group["name"], name))
    return sorted(times, reverse=True)


OLDEST_SNAPSHOT = ('max(max_over_time((timestamp(gpufleet_collector_last_success_timestamp_seconds{{collector="gpu"}})'
                   ' - gpufleet_collector_last_success_timestamp_seconds{{collector="gpu"}})[{window}]))')
"""The oldest GPU snapshot a store scraped over `window` (a subquery range such as `300s:` or `300s:15s`): each
node is collected once per interval, so this says whether the simulator kept up."""


def rule_group_metrics(url: str, timeout: float = 60.0) -> dict[tuple[str, str], float]:
    """(metric, rule group) -> value, from Prometheus's own /metrics: each group's last duration, interval,
    missed iterations and failed evaluations (a group's label is `file;name`: the name is kept)."""
    return own_metrics(url, timeout, lambda _name, labels: labels.get("rule_group", "").split(";")[-1] or None)
