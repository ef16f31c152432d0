"""All rule groups, in the order Prometheus should load them, rendered into one file.

Conventions are those of kubernetes-mixin and node-mixin: CamelCase names with a
`Gpu`/`Nic`/`Node`/`Fabric` prefix, `Job` for what a whole job shows (`Alertmanager`, and the `Watchdog`,
for the pipeline's own); `severity` critical (page now), warning (ticket) or info (not routed); annotations
`summary`, `description` and `runbook_url`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import yaml

from gpufleet.alerts.bmc import bmc
from gpufleet.alerts.capacity import capacity
from gpufleet.alerts.config import Config, ConfigError
from gpufleet.alerts.dcgm import dcgm_compat
from gpufleet.alerts.drift import drift
from gpufleet.alerts.exporter import collector_health, exporter_health
from gpufleet.alerts.fabric import fabric, fabric_trends
from gpufleet.alerts.gpu import gpu_failures, gpu_trends
from gpufleet.alerts.history import history
from gpufleet.alerts.jobs import jobs
from gpufleet.alerts.kernel import kernel
from gpufleet.alerts.maintenance import maintenance, maintenance_trends
from gpufleet.alerts.nvswitch import nvswitch
from gpufleet.alerts.pcie import pcie
from gpufleet.alerts.pipeline import pipeline
from gpufleet.alerts.recording import shared
from gpufleet.alerts.reliability import reliability
from gpufleet.alerts.remediation import remediation
from gpufleet.alerts.rule import TREND_INTERVAL
from gpufleet.alerts.storage import storage
from gpufleet.alerts.stragglers import stragglers

Engine: TypeAlias = Literal["prometheus", "vmalert"]
ENGINES: tuple[Engine, ...] = ("prometheus", "vmalert")
# gpufleet's own rules, and the opt-in dcgm-exporter compatibility layer (`alerts.dcgm`), each a file of its own.
Layer: TypeAlias = Literal["core", "dcgm"]
LAYERS: tuple[Layer, ...] = ("core", "dcgm")


def groups(config: Config) -> list[dict[str, Any]]:
    """Two speeds (see `rule.TREND_INTERVAL`): the pager's groups run at Prometheus's `evaluation_interval`,
    which should be the scrape interval; the first tier and every group that judges minutes of data run every
    minute; capacity and reliability, which the reports read, every five."""
    return [shared(config), maintenance(config), stragglers(config), jobs(config), gpu_failures(config),
            nvswitch(config), storage(config), fabric(config), exporter_health(config), collector_health(config),
            gpu_trends(config), fabric_trends(config), maintenance_trends(config), drift(config), kernel(config),
            pcie(config), *bmc(config),
            *capacity(config), reliability(config), history(config), pipeline(config), remediation(config)]


def recorded_by(rule_groups: list[dict[str, Any]]) -> dict[str, str]:
    """Each recorded series' name -> the name of the group that records it."""
    return {rule["record"]: group["name"] for group in rule_groups for rule in group["rules"] if "record" in rule}


def for_vmalert(rule_groups: list[dict[str, Any]], config: Config) -> list[dict[str, Any]]:
    """The same groups with vmalert's `concurrency` field, which Prometheus 2.42 refuses ("field concurrency not
    found"): how many of a group's rules vmalert asks at once, capped at the group's size. The pager's groups,
    which run at the evaluation interval, ask `vmalert_concurrency`; the minute groups
    `vmalert_trend_concurrency`; the capacity and reliability groups one at a time. At 10,000 GPUs, four at
    once in every group let the capacity and reliability groups take all of the store's query slots when they
    ran, and the pager's worst evaluation reached 35 % of its interval; their five or ten minutes' budget
    needs no such haste.

    Asking rules at once loses no ordering vmalert kept: it writes what a rule records to the store
    asynchronously, and its documentation warns against relying on a record within the same evaluation.
    """
    def concurrency(group: dict[str, Any]) -> int:
        wanted = {None: config.vmalert_concurrency, config.d(TREND_INTERVAL): config.vmalert_trend_concurrency}
        return min(wanted.get(group.get("interval"), 1), len(group["rules"]))

    return [{**{k: v for k, v in group.items() if k != "rules"}, "concurrency": concurrency(group),
             "rules": group["rules"]} for group in rule_groups]


def overridden(rule_groups: list[dict[str, Any]], config: Config) -> list[dict[str, Any]]:
    """The groups with the site's changes to its alerts (`Config.alerts`): a severity, a label, or the alert
    left out. Raises ConfigError for a name that is no alert here."""
    names = {rule["alert"] for group in rule_groups for rule in group["rules"] if "alert" in rule}
    unknown = sorted(set(config.alerts) - names)
    if unknown:
        raise ConfigError(f"alerts: {', '.join(unknown)}: no such alert; the alerts are {', '.join(sorted(names))}")
    changed = []
    for group in rule_groups:
        rules = []
        for rule in group["rules"]:
            change = config.alerts.get(rule.get("alert", ""), {})
            if change.get("disabled"):
                continue
            if "severity" in change or "labels" in change:
                rule = {**rule, "labels": {**rule["labels"], **change.get("labels", {}),
                                           "severity": change.get("severity", rule["labels"]["severity"])}}
            rules.append(rule)
        changed.append({**group, "rules": rules})
    return changed


def render(config: Config | None = None, engine: Engine = "prometheus", layer: Layer = "core") -> str:
    """The rule file of `layer` for `engine`; raises ConfigError where the config's alert changes name no alert."""
    config = config or Config()
    rule_groups = overridden(groups(config), config) if layer == "core" else dcgm_compat(config)
    header = "# Generated by `gpufleet alerts build` from alerts/; edit the code, not this file.\n"
    if layer == "dcgm":
        header += ("# Opt-in: dcgm-exporter's default fields under its names, units and labels, recorded from "
                   "gpufleet's series (docs/exporter/dcgm-exporter.md).\n")
    if engine == "vmalert":
        rule_groups = for_vmalert(rule_groups, config)
        header += "# For vmalert: gpufleet-rules.yml with each group's `concurrency`, which Prometheus refuses.\n"
    return header + yaml.safe_dump({"groups": rule_groups}, sort_keys=False, width=1000, allow_unicode=True)
