"""Every metric name that a rule, a dashboard query or a report reads exists: the exporter serves it, or a rule
records it. The promtool tests feed rules hand-written series, so a name mistyped alike in a rule and its test
would pass there; here it is checked against what the exporter's own code serves."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

from gpufleet import alerts as alerts_package
from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.dashboards.cli import rendered
from gpufleet.devtools.nodes import bench_node, catalogue_exposition
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.reference.metrics import OPT_IN, families
from gpufleet.exporter import node
from gpufleet.remediate.engine import Remediator, Settings
from gpufleet.remediate.server import RemediatorCollector, Webhooks
from gpufleet.remediate.slurm import Slurm

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_NAME = re.compile(r"(?<![\w:$.])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*[a-zA-Z0-9_]|gpufleet_[a-z0-9_]+)(?![\w(])")
_RECORDED = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def read_by(expr: str) -> set[str]:
    """The series names a PromQL expression reads: gpufleet's own, and recorded ones (level:metric:operations);
    names inside string literals (label values, regular expressions) are not reads."""
    return set(_NAME.findall(_STRING.sub('""', expr)))


@pytest.fixture(scope="module")
def served() -> set[str]:
    """Every series name the exporter can serve: the catalogue node and the benchmark's, every opt-in flag on."""
    flags = node.defaults()
    for flag in OPT_IN:
        setattr(flags, flag, True)
    found = families(catalogue_exposition(flags)) | families(bench_node(flags))
    return {name for family in found.values() for name in _series_names(family.name, family.kind)} | _remediators()


def _remediators() -> set[str]:
    """What `gpufleet remediate` serves, which its own alerts read."""
    remediator = Remediator(Slurm(), Settings())
    collector = RemediatorCollector(remediator, Webhooks(remediator, "instance", re.compile("(?P<node>.+)"), None))
    return {sample_name for family in collector.collect()
            for sample_name in ({family.name, f"{family.name}_total"} if family.type == "counter" else {family.name})}


def _series_names(name: str, kind: str) -> set[str]:
    return {name, f"{name}_created"} if kind == "counter" else {name}


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    """gpufleet's rules and the opt-in dcgm-exporter layer's."""
    return [rule for layer in ("core", "dcgm") for group in yaml.safe_load(render(Config(), layer=layer))["groups"]
            for rule in group["rules"]]


def recorded(rules: list[dict]) -> set[str]:
    return {rule["record"] for rule in rules if "record" in rule}


def test_every_name_a_rule_reads_is_served_or_recorded(served: set[str], rules: list[dict]) -> None:
    known = served | recorded(rules)
    unknown = {(rule.get("record") or rule["alert"], name) for rule in rules
               for name in read_by(rule["expr"]) - known}
    assert unknown == set()


def test_every_name_a_dashboard_reads_is_served_or_recorded(served: set[str], rules: list[dict]) -> None:
    known = served | recorded(rules)
    unknown = {(model["uid"], panel["title"], name)
               for model in map(json.loads, rendered().values()) for panel in model["panels"]
               for target in panel.get("targets", []) for name in read_by(target["expr"]) - known}
    assert unknown == set()


def report_names(path: Path) -> set[str]:
    """The names a report module reads: the recorded-series constants it takes from the alert modules, and the
    exporter's names it writes out."""
    tree = ast.parse(path.read_text())
    aliases = {alias.asname or alias.name: getattr(alerts_package, alias.name) for stmt in tree.body
               if isinstance(stmt, ast.ImportFrom) and stmt.module == "gpufleet.alerts" for alias in stmt.names}
    names = set()
    for found in ast.walk(tree):
        if isinstance(found, ast.Attribute) and isinstance(found.value, ast.Name) and found.value.id in aliases:
            value = getattr(aliases[found.value.id], found.attr, None)
            if isinstance(value, str) and (_RECORDED.match(value) or value.startswith("gpufleet_")):
                names.add(value)
        elif isinstance(found, ast.Constant) and isinstance(found.value, str):
            names |= set(re.findall(r"\bgpufleet_[a-z0-9_]*[a-z0-9](?![a-z0-9_])", found.value))
    return names


def test_every_name_a_report_reads_is_served_or_recorded(served: set[str], rules: list[dict]) -> None:
    modules = sorted((ROOT / "report").glob("*.py"))
    unknown = {(path.name, name) for path in modules for name in report_names(path) - served - recorded(rules)}
    assert unknown == set()
    assert any(report_names(path) for path in modules), "the scan found no names: it would pass anything"


def test_the_name_scan_finds_a_typo_shared_by_a_rule_and_its_test(served: set[str], rules: list[dict]) -> None:
    """A mutation of the check itself: a misspelt name in an expression is found."""
    assert read_by('sum by (instance) (rate(gpufleet_gpu_xid_eror_total{xid="79"}[5m]))') - served == {
        "gpufleet_gpu_xid_eror_total"}
    assert read_by("instance:gpufleet_gpus_up:sum > 0 and on() gpufleet_gpu_up") <= served | recorded(rules)
