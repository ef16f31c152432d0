"""A node's record, end to end: the simulator's repairs, a straggler and a flapping port on a real Prometheus with
the generated rules at time scale 16, and a month compressed into an hour (`repeat_fault_window`). The node given
three repairs, and the node given a repair, a straggler episode and a link flap, are ticketed as repeating faults;
the node given two repairs, and every other node, are not; and the reliability report ranks the three by their
record."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

import pytest
import yaml

from gpufleet import cli as gpufleet_cli
from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools.net import http
from gpufleet.devtools.programs import prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.tables import markdown_tables, rows
from gpufleet.devtools.waiting import HarnessError, wait_for

from layouts import node, nodes, write

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
TIME_SCALE = 16
# Production minutes before the first fault. An episode counts only where its node was scraped at the start of
# the interval it began in, which starts up to an interval and the settling minute before it: Prometheus, started
# after the simulator, must be scraping by then on a loaded machine too.
WARM = 20.0
# The straggler's job: its steps a sixteenth of a production step, several to each signal window.
LAYOUT = {"jobs": [{"id": "800001", "scheduler": "slurm", "nodes": nodes(3, 4, 5, 6), "period": 2.6,
                    "comm_fraction": 0.3, "memory_fraction": 0.7}]}
LEMON, FEW, MIXED = node(1), node(2), node(3)


def _at(minutes: float) -> float:
    """Production minutes after the warm-up, as the simulator's (wall) seconds from its start."""
    return (WARM + minutes) * 60 / TIME_SCALE


def _repair(where: str, gpu: int, minutes: float) -> list[dict]:
    """A double-bit ECC error that holds the GPU at a reset, and the reset two production minutes later."""
    return [{"kind": "ecc_dbe", "node": where, "gpu": gpu, "start": _at(minutes)},
            {"kind": "gpu_reset", "node": where, "gpu": gpu, "start": _at(minutes + 2)}]


# A node's episodes this many production minutes apart. A repair counts where its node had none at the start of
# the interval judged, which comes up to the history group's interval and its settling minute before it: so the
# node's previous repair (two minutes to its reset, and the reset's GPU off the bus) must be done by then.
APART = 16
# The straggler's ticket fires some five minutes into it.
FAULTS = [
    *_repair(LEMON, 1, 0), *_repair(LEMON, 2, APART), *_repair(LEMON, 3, 2 * APART),
    *_repair(FEW, 1, 0), *_repair(FEW, 2, APART),
    {"kind": "ib_link_flap", "node": MIXED, "port": "mlx5_0/1", "start": _at(0), "duration": _at(2) - _at(0)},
    {"kind": "straggler", "node": MIXED, "cause": "clock", "start": _at(0), "duration": _at(25) - _at(0)},
    *_repair(MIXED, 1, 2 * APART),
]


def _tickets(url: str) -> dict[str, dict]:
    status, body = http("GET", f"{url}/api/v1/alerts")
    assert status == 200, body
    return {a["labels"]["instance"]: a for a in json.loads(body)["data"]["alerts"]
            if a["labels"]["alertname"] == "NodeRepeatedFaults" and a["state"] == "firing"}


def with_timeout(check: Callable[[], object], timeout: float) -> bool:
    """Whether `check` came true within `timeout` seconds."""
    try:
        return bool(wait_for(check, timeout, "the check"))
    except HarnessError:
        return False


def test_the_node_that_keeps_failing_is_ticketed_and_no_other(tmp_path):
    config = Config(repeat_fault_window="1h").scaled(TIME_SCALE)
    rules = tmp_path / "rules.yml"
    rules.write_text(render(config))
    layout = write(tmp_path / "layout.yml", LAYOUT)
    targets, scenario = tmp_path / "targets.json", tmp_path / "scenario.yml"
    scenario.write_text(yaml.safe_dump({"faults": FAULTS}))
    with contextlib.ExitStack() as stack:
        stack.enter_context(simulator(targets, "--nodes=8", "--seed=0", f"--layout={layout}",
                                      "--collect-interval=1s", "--cluster=history", f"--scenario={scenario}"))
        url = stack.enter_context(prometheus(prometheus_config(tmp_path / "prometheus.yml", targets, "1s", rules),
                                             tmp_path / "data")).url
        # The last episodes are recorded a minute (SETTLE) after the end of the interval after the one they
        # begin in, at the latest; then the alert.
        ticketed = with_timeout(lambda: {LEMON, MIXED} <= set(_tickets(url)), _at(2 * APART + 2 * 10 + 1) + 30)
        tickets = _tickets(url)
        record = {(s["metric"]["instance"], s["metric"]["event"]): float(s["value"][1]) for s in query(
            url, "sum by (instance, event) (count_over_time(instance:gpufleet_node_faults:new10m[1h]))")}
        assert ticketed, f"not both of {LEMON} and {MIXED} ticketed in time; the record: {record}"
        ever = {s["metric"]["instance"] for s in query(
            url, 'count by (instance) (count_over_time(ALERTS{alertname="NodeRepeatedFaults"}[1h]))')}
        # Its steps are whole minutes, and the range ends at one: the next minute's, past the last sample.
        code = gpufleet_cli.main(["report", "reliability", "--prometheus", url, "--range", "1h", "--step", "1m",
                                  "--end", str(time.time() + 60), "--out", str(tmp_path / "report")])
    assert record == {(LEMON, "repair"): 3, (FEW, "repair"): 2, (MIXED, "repair"): 1, (MIXED, "straggler"): 1,
                      (MIXED, "link_flap"): 1}, record
    assert ever == {LEMON, MIXED}, ever
    assert tickets[LEMON]["labels"]["severity"] == "warning"
    assert code == 0
    ranked = [(r["Node"], r["Faults"], r["Repairs"], r["Straggler episodes"], r["Link flaps"]) for r in rows(
        markdown_tables((tmp_path / "report" / "reliability-report.md").read_text()), "Nodes by their record")]
    assert ranked == [(LEMON, "3", "3", "0", "0"), (MIXED, "3", "1", "1", "1"), (FEW, "2", "2", "0", "0")], ranked
    description = tickets[MIXED]["annotations"]["description"]
    assert f"{MIXED} had 3 faults in the last 1 hour (link_flap: 1, repair: 1, straggler: 1)" in description, \
        description
