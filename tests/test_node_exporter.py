"""Beside node_exporter: Debian's real prometheus-node-exporter and gpufleet's collectors over the same fixture
sysfs and procfs trees, compared series by series through the names the rules read (alerts/node_exporter.py)."""

from __future__ import annotations

import contextlib
import math
import re
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from scenario import FAULTS_AT, SCENARIO
from test_alerts_e2e import (
    TIME_SCALE,
    Engine,
    _alertmanager,
    _check,
    _check_held_until_repaired,
    _check_one_incident_per_fault,
    _failed_scrapes,
    _wait_for_deliveries_and_repairs,
    check_heartbeat,
    wait_until_scraped,
)

from gpufleet.alerts.config import Config
from gpufleet.alerts.node_exporter import (
    EXPORTER_FLAGS,
    NAMES,
)
from gpufleet.alerts.rules import render
from gpufleet.dashboards.cli import rendered
from gpufleet.devtools.delivery import AlertLog, Receiver
from gpufleet.devtools.grafana import Target, expand, has_data, ours, targets
from gpufleet.devtools.paths import FIXTURES, memory_directory
from gpufleet.devtools.programs import (
    exporter,
    node_exporter,
    node_exporter_args,
    node_exporters,
    prometheus,
    prometheus_config,
    scrape_jobs,
    simulator,
)
from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter.tree import DiskTree
from gpufleet.simulator.mirror import Mirror

from helpers import parse
from layouts import SIXTEEN_NODES, SIXTEEN_NODES_TOPOLOGY, write

# The fixture's first HCA has 64-bit counters_ext/ beside saturated 32-bit counters/ (an older driver's layout):
# gpufleet reads the 64-bit file, node_exporter's `port_*` series the 32-bit one and its `legacy_*` series the
# 64-bit one. docs/exporter/node-exporter.md says so.
LEGACY = {"node_infiniband_port_data_transmitted_bytes_total": "node_infiniband_legacy_data_transmitted_bytes_total",
          "node_infiniband_port_data_received_bytes_total": "node_infiniband_legacy_data_received_bytes_total",
          "node_infiniband_port_packets_transmitted_total": "node_infiniband_legacy_packets_transmitted_total",
          "node_infiniband_port_packets_received_total": "node_infiniband_legacy_packets_received_total",
          **{f"node_infiniband_{cast}_packets_{way}_total": f"node_infiniband_legacy_{cast}_packets_{way}_total"
             for cast in ("unicast", "multicast") for way in ("transmitted", "received")}}
LEGACY_HCA = "mlx5_0"
# A power sensor with no instantaneous input (an ACPI power meter's) is read by gpufleet from its average, which
# node_exporter exports under a name of its own; the rules read both (Config.power_meter).
AVERAGE = {"node_hwmon_power_watt": "node_hwmon_power_average_watt"}


def scrape(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return parse(response.read())


def _clean(name: str) -> str:
    """A device name as node_exporter writes it into a hwmon chip's name."""
    return re.sub(r"[^a-z0-9:]", "_", name.lower())


def counterpart(ours: str, labels: dict[str, str], theirs: dict, chips: dict[str, str]) -> list[float]:
    """The values node_exporter gives for gpufleet's series `ours` with `labels`."""
    name = NAMES[ours]
    if labels.get("device") == LEGACY_HCA and name in LEGACY:
        name = LEGACY[name]
    if "zone" in labels:  # node_exporter numbers a thermal zone.
        labels = {**labels, "zone": labels["zone"].removeprefix("thermal_zone")}
    found = _values(name, labels, theirs, chips)
    return found or _values(AVERAGE.get(name, ""), labels, theirs, chips)


def _values(name: str, labels: dict[str, str], theirs: dict, chips: dict[str, str]) -> list[float]:
    found = []
    for (series, their_labels), value in theirs.items():
        other = dict(their_labels)
        if series != name:
            continue
        if "sensor" in labels:  # hwmon: the chip by its driver's name and the device its link leads to, if any.
            chip = other["chip"]
            if (chips.get(chip, labels["chip"]) != labels["chip"] or other["sensor"] != labels["sensor"]
                    or not (chip.endswith(_clean(labels["device"])) or chip == labels["chip"])):
                continue
        elif name.endswith("_info"):
            if other["device"] != labels["device"]:
                continue
        elif any(other.get(key) != value for key, value in labels.items()):
            continue
        found.append(1.0 if name.endswith("_info") else value)
    return found


def test_node_exporter_reads_the_same_values_under_the_names_the_rules_read(tmp_path):
    # Links written as symlinks to directories that exist: node_exporter names a hwmon chip by where its link leads.
    Mirror(DiskTree(FIXTURES / "sys"), tmp_path / "sys").sync()
    with exporter(f"--path.procfs={FIXTURES / 'proc'}") as ours, \
            node_exporter(tmp_path / "sys", *node_exporter_args(FIXTURES / "proc")) as theirs:
        mine, node = scrape(ours.url), scrape(theirs.url)
    assert all(value == 1 for (name, _), value in node.items() if name == "node_scrape_collector_success"), node
    chips = {dict(labels)["chip"]: dict(labels)["chip_name"] for (name, labels), _ in node.items()
             if name == "node_hwmon_chip_names"}
    compared, differing = set(), []
    for (name, labels), value in mine.items():
        if name not in NAMES:
            continue
        found = counterpart(name, dict(labels), node, chips)
        if len(found) != 1 or not math.isclose(found[0], value, rel_tol=1e-12):
            differing.append((name, dict(labels), value, found))
        compared.add(name)
    assert differing == [], "\n".join(map(str, differing))
    # Every renamed reading the fixture has was compared: at least one of each collector.
    assert {name.split("_")[1] for name in compared} == {"infiniband", "network", "hwmon", "thermal"}
    assert len(compared) >= 50, sorted(compared)


def test_beside_node_exporter_the_exporter_stores_nothing_twice_and_keeps_what_node_exporter_lacks():
    def collected(url: str) -> set[str] | None:
        """The names served once the InfiniBand collector's first pass is in: the first scrape may come before."""
        names = {name for name, _ in scrape(url)}
        return names if "gpufleet_infiniband_port_info" in names else None

    with exporter(f"--path.procfs={FIXTURES / 'proc'}", *EXPORTER_FLAGS) as ours:
        mine = wait_for(lambda: collected(ours.url), 20, "the InfiniBand collector's first pass")
    assert not mine & set(NAMES)
    assert not {name for name in mine if name.startswith(("gpufleet_network_", "gpufleet_hwmon_",
                                                          "gpufleet_thermal_zone_"))}
    assert {"gpufleet_infiniband_port_seen_active", "gpufleet_infiniband_rate_capability_bytes_per_second",
            "gpufleet_infiniband_hw_out_of_buffer_total", "gpufleet_infiniband_port_info"} <= mine
    assert "gpufleet_gpu_up" in mine


@pytest.mark.slow
@pytest.mark.e2e
def test_the_scenario_fires_the_same_alerts_and_every_dashboard_query_answers_beside_node_exporter(tmp_path):
    """The end-to-end scenario (test_alerts_e2e) in node_exporter mode, in Prometheus: the simulator runs its
    exporters beside node_exporter and writes each node's sysfs and procfs out, a real node_exporter per node
    reads them, and the rules and dashboards are built with `node_exporter_job: node`. Every alert fires and
    reaches its receiver as in gpufleet's own mode, nothing else does, and every query of the dashboards that
    read node_exporter's series returns data."""
    scenario = tmp_path / "scenario.yml"
    scenario.write_text(yaml.safe_dump({"faults": [{"start": f"{FAULTS_AT}s", **fault} for fault, _ in SCENARIO]}))
    config = Config(node_exporter_job="node")
    rules, dashboards = tmp_path / "rules.yml", tmp_path / "dashboards"
    rules.write_text(render(config.scaled(TIME_SCALE)))
    dashboards.mkdir()
    # The dashboards that read node-level series; the others are the same in both modes, and test_dashboards
    # proves their queries over faults of every kind.
    own = rendered()
    changed = {name: text for name, text in rendered(config).items() if text != own[name]}
    assert set(changed) == {"gpufleet-fabric.json", "gpufleet-node.json"}
    for name, text in changed.items():
        (dashboards / name).write_text(text)
    targets, node_targets = tmp_path / "targets.json", tmp_path / "node-targets.json"
    receiver = Receiver()
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(memory_directory())
        stack.enter_context(simulator(
            targets, "--nodes=16", "--seed=0", f"--layout={write(tmp_path / 'layout.yml', SIXTEEN_NODES)}",
            f"--topology={write(tmp_path / 'topology.yml', SIXTEEN_NODES_TOPOLOGY)}", "--cluster=e2e",
            "--collect-interval=1s", f"--scenario={scenario}", f"--node-exporter-root={root}"))
        started = time.monotonic()
        node_exporters(stack, root, targets, node_targets)
        am = stack.enter_context(_alertmanager(tmp_path / "am", receiver)).url
        prom_config = prometheus_config(tmp_path / "prometheus.yml", targets, "1s", rules, am)
        settings = yaml.safe_load(prom_config.read_text())
        settings["scrape_configs"] += scrape_jobs(node_targets, job="node")
        prom_config.write_text(yaml.safe_dump(settings))
        url = stack.enter_context(prometheus(prom_config, tmp_path / "data")).url
        wait_until_scraped(url, 2 * len(SIXTEEN_NODES_TOPOLOGY["nodes"]), started)  # gpufleet's and node_exporter's
        engine = Engine("prometheus", AlertLog(url), receiver, url)
        try:
            _wait_for_deliveries_and_repairs([engine], started)
            pending = _without_data(url, dashboards)
            deadline = time.monotonic() + 60
            while pending and time.monotonic() < deadline:
                time.sleep(2)
                pending = _without_data(url, dashboards, pending)
        finally:
            engine.log.stop()
        # Asked after the log stopped, so a scrape that failed while the dashboards were read is counted too.
        failed = _failed_scrapes(url, started)
    check_heartbeat(receiver)
    _check(engine, started, [], failed)
    _check_held_until_repaired(engine, started)
    _check_one_incident_per_fault(engine, started)
    assert not pending, "queries without data:\n" + "\n".join(f"{t.uid} / {t.title}: {t.expr}" for t in pending)


def _without_data(url: str, dashboards: Path, among: Iterable[Target] | None = None) -> list[Target]:
    return [t for t in (among if among is not None else ours(targets(dashboards)))
            if not has_data(url, expand(t.expr), t.instant)]
