"""The scale tier (three vmagents, VictoriaMetrics, vmalert) from its compose command lines and configs, through
the drills an on-call engineer must not notice: a vmagent lost, and the store away for a minute."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from gpufleet.alerts.cli import VMALERT_RULES_FILE
from gpufleet.dashboards.cli import OUTPUT as DASHBOARDS
from gpufleet.devtools.compose import AGENTS, COMPOSE, SERVICES, command_flags
from gpufleet.devtools.delivery import alertmanager_alerts
from gpufleet.devtools.grafana import expand, targets
from gpufleet.devtools.net import free_port, http
from gpufleet.devtools.processes import serving
from gpufleet.devtools.programs import binary, blackbox_exporter
from gpufleet.devtools.prom import query, scraped_instances
from gpufleet.devtools.waiting import wait_for

from stack import NODES, compose_alertmanager_and_simulator, flag, host_command, host_config, host_path, paged

# vmalert's copy: the same groups, each with how many of its rules vmalert asks at once.
CONCURRENCY = {g["name"]: g["concurrency"] for g in yaml.safe_load(VMALERT_RULES_FILE.read_text())["groups"]}
STORE_OUTAGE = 60.0  # Seconds VictoriaMetrics stays stopped in the scale tier's drill.
MAX_HOLE = 22.5  # Seconds: longer than one 15 s scrape interval, shorter than two, so one lost scrape shows.


def up_gaps(vm_url: str, start: float, end: float) -> dict[str, float]:
    """Each node's longest stretch without an `up` sample in [start, end] (Unix seconds), from the raw samples
    VictoriaMetrics holds: what a dashboard or rule would see as a hole in the series."""
    status, body = http("GET", f"{vm_url}/api/v1/export?" + urllib.parse.urlencode(
        {"match[]": 'up{job="gpufleet"}', "start": int(start), "end": int(end) + 1}))
    assert status == 200, body
    gaps: dict[str, float] = {}
    for line in body.splitlines():
        series = json.loads(line)
        times = sorted(t / 1000 for t in series["timestamps"] if start <= t / 1000 <= end)
        gap = max(b - a for a, b in itertools.pairwise([start, *times, end]))
        instance = series["metric"]["instance"]
        gaps[instance] = max(gap, gaps.get(instance, 0.0))
    return gaps


class ScaleTier:
    """VictoriaMetrics, the vmagents and vmalert from their compose command lines and configs (with
    -loggerLevel=WARN added), each on a loopback port, entered on `stack`."""

    def __init__(self, stack: contextlib.ExitStack, tmp_path: Path, am_url: str) -> None:
        self.stack = stack
        self.named = {"sim-targets": tmp_path / "sim-targets", "victoriametrics-data": tmp_path / "vm",
                      **{volume: tmp_path / volume for volume in COMPOSE["volumes"] if volume.endswith("-buffer")}}
        blackbox = stack.enter_context(blackbox_exporter(
            host_path("blackbox", flag(SERVICES["blackbox"]["command"], "--config.file"))))
        self.addresses = {"alertmanager:9093": am_url.removeprefix("http://"),
                          "blackbox:9115": blackbox.url.removeprefix("http://")}
        for name in ("victoriametrics", "vmalert", *AGENTS):
            self.addresses[name + command_flags(name)["-httpListenAddr"]] = f"127.0.0.1:{free_port()}"
        self.url = {name: f"http://{self.addresses[name + command_flags(name)['-httpListenAddr']]}"
                    for name in ("victoriametrics", "vmalert", *AGENTS)}
        self.store = self.start("victoriametrics", "victoria-metrics")
        self.agents = {}
        for name in AGENTS:
            scrape = command_flags(name)["-promscrape.config"]
            config = host_config(name, scrape, tmp_path / f"{name}.yml", self.named, self.addresses)
            self.agents[name] = self.start(name, "vmagent", {scrape: config})
        self.start("vmalert", "vmalert")

    def start(self, name: str, program: str, files: dict[str, Path] | None = None) -> contextlib.ExitStack:
        argv = [binary(program), *host_command(name, self.named, self.addresses, files or {}), "-loggerLevel=WARN"]
        running = contextlib.ExitStack()
        running.enter_context(serving(argv, int(self.url[name].rsplit(":", 1)[1]), "/health", f"{name} start", 60))
        return self.stack.enter_context(running)

    def shared_out(self) -> dict[str, set[str]] | None:
        """Each vmagent's nodes, once every node is scraped by two of them."""
        scraped = {name: scraped_instances(self.url[name]) & NODES for name in AGENTS}
        return scraped if all(sum(node in s for s in scraped.values()) == 2 for node in NODES) else None

    def refused_dashboard_queries(self) -> list[tuple[str, str, bytes]]:
        """The dashboards' queries, unchanged, as Grafana would send them to VictoriaMetrics, that it refused."""
        refused = []
        for target in targets(DASHBOARDS):
            status, body = http("GET", f"{self.url['victoriametrics']}/api/v1/query?query="
                                + urllib.parse.quote(expand(target.expr, 15)))
            if status != 200:
                refused.append((target.uid, target.title, body))
        return refused


def fault(sim_url: str, node: str) -> None:
    status, _ = http("POST", f"{sim_url}/control/faults", {"kind": "xid", "node": node, "gpu": 0, "xid": 79})
    assert status == 201


def store_outage(tier: ScaleTier, am_url: str, sim_url: str, standing: dict,
                 second: str) -> tuple[list[int], float, float]:
    """VictoriaMetrics stopped for STORE_OUTAGE seconds while `standing` pages and `second` faults: nothing may
    page before it is back, and the second page must come once it is. Returns the seconds into the outage at
    which Alertmanager no longer held the standing page as it was, how long the second page took once the store
    was back, and when (Unix seconds) it came back."""
    kept = (standing["labels"], standing["startsAt"])
    dropped: list[int] = []

    def second_paged() -> list[dict]:
        held = alertmanager_alerts(am_url)
        if not any((a["labels"], a["startsAt"]) == kept for a in held):
            dropped.append(round(time.monotonic() - outage))
        return [a for a in held if a["labels"]["alertname"] == "GpuNeedsReboot" and a["labels"]["instance"] == second]

    tier.store.close()
    outage = time.monotonic()
    fault(sim_url, second)
    while time.monotonic() < outage + STORE_OUTAGE:
        assert not second_paged(), "a page while the store was down"
        time.sleep(1)
    tier.start("victoriametrics", "victoria-metrics")
    returned, returned_at = time.monotonic(), time.time()
    wait_for(second_paged, 150, "the second GpuNeedsReboot at Alertmanager")
    return dropped, time.monotonic() - returned, returned_at


def _pages(am_url: str, at_least: int) -> list[tuple[str, str]] | None:
    """The alert name and node of each alert Alertmanager holds for the pager, once there are `at_least`."""
    pages = [(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in alertmanager_alerts(am_url)
             if "pager" in [r["name"] for r in a["receivers"]]]
    return pages if len(pages) >= at_least else None


def drained_holes(vm_url: str, start: float, end: float) -> dict[str, float]:
    """Each node's longest hole in `up` once the buffers have drained: they are given a minute to fill every
    hole they can."""
    for _ in range(60):
        holes = up_gaps(vm_url, start, end)
        if set(holes) == NODES and max(holes.values()) <= MAX_HOLE:
            break
        time.sleep(1)
    return holes


@pytest.mark.slow
@pytest.mark.e2e
def test_the_scale_tier_pages_through_vmalert_past_a_lost_vmagent_and_a_store_outage(tmp_path):
    """The scale tier from its compose command lines and configs, Alertmanager and the simulator as in the single
    stack. Two drills:
    - one vmagent is stopped once the targets are shared out: a fault on a node it scraped must page;
    - then VictoriaMetrics is stopped for a minute while that page stands, and a second node faults meanwhile:
      the standing page must stay at Alertmanager, unresolved and with its start (no second page), the new
      fault must page once the store is back and not before, nothing else may page, and the vmagents' disk
      buffers must leave no node's series with a hole, from the vmagent's stop to the store's return."""
    with compose_alertmanager_and_simulator(tmp_path) as (am_url, sim_url, _), contextlib.ExitStack() as stack:
        tier = ScaleTier(stack, tmp_path, am_url)
        scraped = wait_for(tier.shared_out, 60, "every node scraped by two vmagents")
        # Each node probed too, through the vmagents' probe job, under the `instance` its exporter has.
        wait_for(lambda: len(query(tier.url["victoriametrics"], 'probe_success{cluster="sim"} == 1')) == len(NODES),
                 60, "every node's probe in the store")
        tier.agents[AGENTS[1]].close()
        stopped, stopped_at = time.monotonic(), time.time()
        node, second = sorted(scraped[AGENTS[1]])[:2]  # Now scraped by one vmagent only.
        fault(sim_url, node)
        alert = wait_for(lambda: paged(am_url, "GpuNeedsReboot"), 150, "GpuNeedsReboot at Alertmanager")[0]
        fired = time.monotonic() - stopped
        groups = json.loads(http("GET", f"{tier.url['vmalert']}/api/v1/rules")[1])["data"]["groups"]
        refused = tier.refused_dashboard_queries()
        dropped, paged_again, returned_at = store_outage(tier, am_url, sim_url, alert, second)
        holes = drained_holes(tier.url["victoriametrics"], stopped_at, returned_at + 15)
        # Each node's page for its repair: at once where its GPUs had work, two minutes on where it idles in service.
        pages = wait_for(lambda: _pages(am_url, 2), 180, "both nodes' pages")
    # The repair is a ticket, and the remediator's too, which names no service until a site runs one.
    assert alert["labels"]["instance"] == node and [r["name"] for r in alert["receivers"]] == ["remediate", "ticket"]
    assert {g["name"]: g["concurrency"] for g in groups} == CONCURRENCY
    assert [(r["name"], r["lastError"]) for g in groups for r in g["rules"] if r["health"] != "ok"] == []
    assert refused == [], "VictoriaMetrics refused dashboard queries"
    assert dropped == [], "the standing page was resolved or restarted at these seconds of the outage"
    # The demo scenario's own faults in these minutes (an application XID) open no page.
    assert sorted(pages) == [("GpuRepairUrgent", node), ("GpuRepairUrgent", second)]
    assert {n: gap <= MAX_HOLE for n, gap in holes.items()} == dict.fromkeys(NODES, True), holes
    print(f"vmagent stopped to GpuNeedsReboot at Alertmanager: {fired:.0f}s; store back to the second page: "
          f"{paged_again:.0f}s; longest hole in a node's up: {max(holes.values()):.1f}s")
