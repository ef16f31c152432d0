"""The BMC rules beside the real ipmi_exporter: Debian's `prometheus-ipmi-exporter` runs scripts that print
FreeIPMI's output for a healthy node and a failing one (tests/fixtures/freeipmi/), Prometheus scrapes it with the
job docs/exporter/ipmi-exporter.md gives and evaluates the generated rules at time scale 8; the node dashboard's BMC
panels draw what it scraped."""

from __future__ import annotations

import contextlib
import json
import stat
from pathlib import Path

import pytest
import yaml

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.dashboards.cli import OUTPUT
from gpufleet.devtools import grafana
from gpufleet.devtools.net import http
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.programs import ipmi_exporter, prometheus, prometheus_config
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import wait_for

from helpers import documented_yaml

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
TIME_SCALE = 8  # The BMC alerts' five minutes are 37.5 s.
FIXTURES = ROOT / "tests" / "fixtures" / "freeipmi"
# What ipmi_exporter's default module runs, each printing its recorded output.
PROGRAMS = ("ipmimonitoring", "ipmi-dcmi", "bmc-info", "ipmi-chassis")
FAILING, HEALTHY = "gpu-node-0001:19400", "gpu-node-0002:19400"
LISTED = "gpu-node-0099.invalid:19400"  # A node of the gpufleet job's target list, never answering.


def _freeipmi(tmp_path: Path, node: str) -> Path:
    """A FreeIPMI directory whose programs print the node's recorded output, whatever they are asked."""
    directory = tmp_path / node
    directory.mkdir()
    for program in PROGRAMS:
        script = directory / program
        script.write_text(f"#!/bin/sh\nexec cat {FIXTURES / node / program}.txt\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


def _firing(prom_url: str) -> set[tuple[str, str]]:
    return {(r["metric"]["alertname"], r["metric"]["instance"])
            for r in query(prom_url, 'ALERTS{alertstate="firing",job="ipmi"}')}


def test_a_failed_supply_a_stopped_fan_and_a_hot_inlet_fire_under_the_nodes_instance(tmp_path):
    config = tmp_path / "ipmi.yml"
    config.write_text(yaml.safe_dump({"modules": {"default": {"collectors": ["ipmi", "dcmi", "bmc", "chassis"]}}}))
    rules = tmp_path / "rules.yml"
    rules.write_text(render(Config().scaled(TIME_SCALE)))
    targets = tmp_path / "nodes.json"
    with contextlib.ExitStack() as stack:
        exporters = {instance: stack.enter_context(ipmi_exporter(_freeipmi(tmp_path, kind), config))
                     for instance, kind in ((FAILING, "failing"), (HEALTHY, "healthy"))}
        targets.write_text(json.dumps(
            [{"targets": [server.url.removeprefix("http://")], "labels": {"instance": instance, "cluster": "c"}}
             for instance, server in exporters.items()] + [{"targets": [LISTED], "labels": {}}]))
        prom_config = prometheus_config(tmp_path / "prometheus.yml", tmp_path / "none.json", "1s", rules)
        document = yaml.safe_load(prom_config.read_text())
        [job] = documented_yaml("exporter/ipmi-exporter.md", "One incident per node: the same `instance`")
        job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
        document["scrape_configs"].append(job)
        prom_config.write_text(yaml.safe_dump(document))
        prom_url = stack.enter_context(prometheus(prom_config, tmp_path / "data")).url
        wait_for(lambda: len(query(prom_url, 'ipmi_up{job="ipmi",collector="ipmi"} == 1')) == 2, 30,
                 "both BMCs read")
        scraped = query(prom_url, 'ipmi_fan_speed_rpm{job="ipmi",name="Fan2"}')
        expected = {("NodePowerSupplyFailed", FAILING), ("NodeFanFailed", FAILING),
                    ("NodeInletTemperatureHigh", FAILING)}
        fired = wait_for(lambda: (found := _firing(prom_url)) >= expected and found, 120, "the three BMC alerts")
        targets_seen = json.loads(http("GET", f"{prom_url}/api/v1/targets")[1])["data"]["activeTargets"]
        inlet = query(prom_url, 'ALERTS{alertname="NodeInletTemperatureHigh",alertstate="firing"}')[0]["metric"]
        panels = grafana.beside(grafana.targets(OUTPUT), "ipmi_")  # The node dashboard's BMC panels.
        empty = [t.title for t in panels if not grafana.has_data(prom_url, grafana.expand(t.expr), t.instant)]
    assert {(r["metric"]["instance"], r["value"][1]) for r in scraped} == {(FAILING, "0"), (HEALTHY, "9240")}
    assert fired == expected, fired
    assert (inlet["name"], inlet["severity"]) == ("Inlet Temp", "critical")
    assert {t.title for t in panels} == {"BMC sensors not nominal", "Inlet temperature (BMC)"} and not empty, empty
    listed = next(t for t in targets_seen if t["discoveredLabels"]["__address__"] == LISTED)
    assert listed["scrapeUrl"] == "http://gpu-node-0099.invalid:9290/metrics"
    assert (listed["labels"]["instance"], listed["labels"]["cluster"]) == (LISTED, "gpufleet")
