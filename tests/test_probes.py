"""A node down and an exporter down, told apart end to end: the simulator's probe ports, the real
blackbox_exporter with the compose stack's modules, Prometheus with the compose stack's `gpufleet-probe` job and the
generated rules (time scale 8), and Alertmanager with the production routing, delivering to a receiver here."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.dashboards.cli import OUTPUT
from gpufleet.devtools import grafana
from gpufleet.devtools.delivery import Receiver, routing
from gpufleet.devtools.net import free_port, free_ports, http
from gpufleet.devtools.paths import COMPOSE_DIR
from gpufleet.devtools.programs import alertmanager, blackbox_exporter, prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import wait_for

TIME_SCALE = 8  # NodeExporterDown's and NodeUnreachable's five minutes are 37.5 s.
NODES = 4
FAULTS_AT = 15  # Seconds after the fleet starts: every target is scraped and probed by then.
DOWN, EXPORTER_DOWN, REBOOTED = "gpu-node-0002", "gpu-node-0003", "gpu-node-0004"
# A node listed in the site's own target files, as `host:port` of its exporter: probed at its host alone.
LISTED = "gpu-node-0099.invalid:19400"


def _probe_job(probes: list[Path], blackbox: str) -> dict:
    """The compose stack's probe job, reading `probes` and asking the blackbox_exporter here."""
    config = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == "gpufleet-probe")
    job["file_sd_configs"] = [{"files": [str(p) for p in probes], "refresh_interval": "1s"}]
    for rule in job["relabel_configs"]:
        if rule.get("replacement") == "blackbox:9115":
            rule["replacement"] = blackbox.removeprefix("http://")
    return job


def _paged(receiver: Receiver, instance: str) -> tuple[set[str], int]:
    """The alert names the pager heard of as firing on `instance`, and in how many incidents."""
    names, incidents = set(), 0
    for _, pages in receiver.incidents():
        mine = {a["alertname"] for page in pages for a in page.alerts if a.get("instance") == instance}
        names |= mine
        incidents += bool(mine)
    return names, incidents


@pytest.mark.slow
@pytest.mark.e2e
def test_a_node_down_pages_as_unreachable_and_an_exporter_down_as_exporter_down(tmp_path):
    """The simulator closes a down node's probe port: it pages NodeUnreachable, not NodeExporterDown. A node whose
    exporter alone stops answers its probe: NodeExporterDown. A reboot shorter than the pages' `for` pages nobody.
    Each is one incident. A node from the site's own target files is probed at its host, under its `instance`."""
    scenario = tmp_path / "scenario.yml"
    scenario.write_text(yaml.safe_dump({"faults": [
        {"kind": "node_down", "node": DOWN, "start": f"{FAULTS_AT}s"},
        {"kind": "exporter_down", "node": EXPORTER_DOWN, "start": f"{FAULTS_AT}s"},
        {"kind": "node_reboot", "node": REBOOTED, "start": f"{FAULTS_AT}s", "duration": "20s"}]}))
    rules = tmp_path / "rules.yml"
    rules.write_text(render(Config().scaled(TIME_SCALE)))
    targets, probes, listed = tmp_path / "targets.json", tmp_path / "probes.json", tmp_path / "nodes.json"
    listed.write_text(json.dumps([{"targets": [LISTED], "labels": {}}]))
    receiver = Receiver()
    (tmp_path / "am").mkdir()
    with contextlib.ExitStack() as stack:
        blackbox = stack.enter_context(blackbox_exporter(COMPOSE_DIR / "blackbox" / "blackbox.yml"))
        am = stack.enter_context(alertmanager(tmp_path / "am", routing(tmp_path, receiver, TIME_SCALE)))
        stack.enter_context(simulator(
            targets, f"--nodes={NODES}", "--seed=0", "--cluster=e2e", "--collect-interval=1s",
            f"--probe-ports={free_ports(NODES)}", f"--probe-sd={probes}", f"--scenario={scenario}"))
        started = time.monotonic()
        config = prometheus_config(tmp_path / "prometheus.yml", targets, "1s", rules, am.url)
        document = yaml.safe_load(config.read_text())
        document["scrape_configs"].append(_probe_job([probes, listed], blackbox.url))
        config.write_text(yaml.safe_dump(document))
        prom_url = stack.enter_context(prometheus(config, tmp_path / "data")).url
        wait_for(lambda: len(query(prom_url, 'probe_success{job="gpufleet-probe"}')) == NODES + 1, 60,
                 "every node probed")
        probed = json.loads(http("GET", f"{prom_url}/api/v1/targets")[1])["data"]["activeTargets"]
        panels = grafana.beside(grafana.targets(OUTPUT), "probe_")  # The node dashboard's probe panel.
        empty = [t.title for t in panels if not grafana.has_data(prom_url, grafana.expand(t.expr), t.instant)]
        wait_for(lambda: _paged(receiver, DOWN)[0] and _paged(receiver, EXPORTER_DOWN)[0], 150, "the two pages")
        time.sleep(10)  # Several group intervals at this scale: a page that should not come would have come.
        print(f"paged {time.monotonic() - started:.0f}s after the fleet started")
    site = next(t for t in probed if t["discoveredLabels"]["__address__"] == LISTED)
    assert site["labels"]["instance"] == LISTED and site["labels"]["cluster"] == "gpufleet", site["labels"]
    assert parse_qs(urlparse(site["scrapeUrl"]).query) == {"module": ["icmp"], "target": ["gpu-node-0099.invalid"]}
    assert _paged(receiver, DOWN) == ({"NodeUnreachable"}, 1)
    assert _paged(receiver, EXPORTER_DOWN) == ({"NodeExporterDown"}, 1)
    assert _paged(receiver, REBOOTED) == (set(), 0)
    assert [t.title for t in panels] == ["Node answers its probe"] and not empty



@pytest.mark.parametrize(("flags", "message"), [
    (["--probe-sd=probes.json"], "--probe-sd needs --probe-ports"),
    (["--probe-ports=65534"], "--probe-ports 65534: 4 nodes need ports past 65535"),
])
def test_the_simulator_refuses_probe_flags_it_cannot_honour(tmp_path, flags, message):
    run = subprocess.run([sys.executable, "-m", "gpufleet", "simulate", f"--nodes={NODES}",
                          f"--web.listen-address=127.0.0.1:{free_port()}", *flags],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 1 and message in run.stderr, run.stderr
