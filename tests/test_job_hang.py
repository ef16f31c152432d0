"""A hung 16-node job, end to end: the simulator's `job_hang` on a real Prometheus with the generated rules at
time scale 8. JobHung must fire within its judged window and `for` plus one evaluation of its group (the hang
begins anywhere between two), which with the pager route's group wait is inside five production minutes; name the
node that failed first; and stay silent on a job beside it whose nodes wait for a straggler."""

from __future__ import annotations

import contextlib
import json
import math
import time

import pytest
import yaml

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.jobs import ACTIVITY_WINDOW
from gpufleet.alerts.rule import TREND_INTERVAL
from gpufleet.alerts.rules import render
from gpufleet.devtools.net import http
from gpufleet.devtools.programs import prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import wait_for

from layouts import node, nodes, write

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
TIME_SCALE = 8
HUNG = "700001"
WAITING = "700002"  # Its nodes wait on a straggler each step: busy, but one of them works.
LAYOUT = {"jobs": [
    {"id": HUNG, "scheduler": "slurm", "nodes": nodes(*range(1, 17)), "period": 5.6, "comm_fraction": 0.28,
     "memory_fraction": 0.7},
    {"id": WAITING, "scheduler": "slurm", "nodes": nodes(17, 18, 19, 20), "period": 4.1, "comm_fraction": 0.3,
     "memory_fraction": 0.6},
]}
WARM_UP = 20.0  # Wall seconds of a healthy fleet before the hang: the rules' windows fill.


def _firing(url: str) -> dict | None:
    status, body = http("GET", f"{url}/api/v1/alerts")
    assert status == 200, body
    return next((a for a in json.loads(body)["data"]["alerts"]
                 if a["labels"]["alertname"] == "JobHung" and a["state"] == "firing"), None)


def test_a_hung_job_pages_in_time_and_names_its_first_failing_node(tmp_path):
    config = Config().scaled(TIME_SCALE)
    rules = tmp_path / "rules.yml"
    rules.write_text(render(config))
    layout = write(tmp_path / "layout.yml", LAYOUT)
    targets, scenario = tmp_path / "targets.json", tmp_path / "scenario.yml"
    # The waiting job's node 17 runs each step 40 % slower from the start: its peers spin part of every step.
    scenario.write_text(yaml.safe_dump({"faults": [{"kind": "straggler", "node": node(17)}]}))
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(simulator(targets, "--nodes=20", "--seed=0", f"--layout={layout}",
                                            "--collect-interval=1s", "--cluster=hang",
                                            f"--scenario={scenario}"))
        url = stack.enter_context(prometheus(prometheus_config(tmp_path / "prometheus.yml", targets, "1s", rules),
                                             tmp_path / "data")).url
        wait_for(lambda: len(query(url, "up == 1")) == 20, 60, "twenty nodes scraped")
        time.sleep(WARM_UP)
        status, body = http("POST", f"{sim.url}/control/faults",
                            {"kind": "job_hang", "node": node(7), "gpu": 2, "xid": 43})
        assert status == 201, body
        injected = time.monotonic()
        # Prometheus judges the window and holds `for` over whole evaluations. One scrape more, and the poll's.
        interval = duration.parse(config.d(TREND_INTERVAL))
        judged = duration.parse(config.d(ACTIVITY_WINDOW)) + duration.parse(config.d(config.job_hang_for))
        limit = math.ceil(judged / interval) * interval + interval + 2
        alert = wait_for(lambda: _firing(url), limit + 30, "JobHung firing")
        took = time.monotonic() - injected
        unrelated = query(url, f'count_over_time(ALERTS{{alertname="JobHung",job_id!="{HUNG}"}}[10m])')
    print(f"JobHung fired {took * TIME_SCALE / 60:.1f} production minutes after the hang began "
          f"(limit {limit * TIME_SCALE / 60:.1f})")
    assert took <= limit, f"JobHung took {took:.0f} s, more than its window, for and an evaluation ({limit:.0f} s)"
    assert alert["labels"]["job_id"] == HUNG and alert["labels"]["severity"] == "critical"
    description = alert["annotations"]["description"]
    assert f"The first fault signal on its nodes: {node(7)}, XID 43 on GPU 2, at " in description, description
    assert f"Its nodes: {', '.join(nodes(*range(1, 9)))} and more, 16 in all." in description, description
    assert unrelated == [], "the job waiting for its straggler went pending as hung"

