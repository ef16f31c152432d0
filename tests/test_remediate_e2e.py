"""Fault to page to drain to repair to resume, end to end: the simulator's fleet, a real Prometheus with the
generated rules at time scale 8, Alertmanager with the production routing, `gpufleet remediate` acting, and
Debian's Slurm holding the simulator's nodes."""

from __future__ import annotations

import contextlib
import getpass
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools.delivery import Receiver, routing
from gpufleet.devtools.net import http
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import alertmanager, prometheus, prometheus_config, remediator, simulator
from gpufleet.devtools.prom import own_metric, query
from gpufleet.devtools.slurm import Slurm, slurm
from gpufleet.devtools.waiting import wait_for

from layouts import node, write

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
TIME_SCALE = 8
NODES = [node(number) for number in range(1, 6)]
MAINTAINED, PLAIN = NODES[3], NODES[4]  # Rebooted for ten production minutes, in a maintenance reservation or not.
OPERATOR = "ops: PSU swap scheduled (ticket 5120)"
# One Slurm job, on the first node and the two rebooted ones: nodes 2 and 3 sit idle, whose repairs page nobody.
LAYOUT = {"jobs": [{"id": "5150", "scheduler": "slurm", "nodes": [NODES[0], MAINTAINED, PLAIN]}]}


def _remediate_receiver(path, url: str, token) -> None:
    """The production routing's `remediate` receiver named, as a site that runs the service names it."""
    config = yaml.safe_load(path.read_text())
    [receiver] = [r for r in config["receivers"] if r["name"] == "remediate"]
    receiver["webhook_configs"] = [{"url": f"{url}/webhook", "send_resolved": True,
                                    "http_config": {"authorization": {"credentials_file": str(token)}}}]
    path.write_text(yaml.safe_dump(config))


def _fault(sim_url: str, **fault) -> None:
    status, body = http("POST", f"{sim_url}/control/faults", fault)
    assert status == 201, body


@dataclass
class Stack:
    cluster: Slurm
    remediate: Server
    sim_url: str
    prom_url: str


@contextlib.contextmanager
def _stack(tmp_path: Path, receiver: Receiver) -> Iterator[Stack]:
    """Slurm, the remediator acting behind a token (its check fails where a `fail-<node>` file is), Alertmanager
    sending to `receiver` and to the remediator, the simulator, and Prometheus scraping the nodes and it."""
    token = tmp_path / "token"
    token.write_text("e2e-remediate-token\n")
    check = f"sh -c 'echo checked {{node}}; test ! -e {tmp_path}/fail-{{node}}'"
    rules = tmp_path / "rules.yml"
    rules.write_text(render(Config().scaled(TIME_SCALE)))
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(slurm(tmp_path / "slurm", NODES, daemons=len(NODES)))
        remediate = stack.enter_context(remediator(
            # Three of the five nodes at once: past the default breaker of a tenth of a partition.
            cluster.env, "--no-dry-run", "--breaker.max-share=0.75", "--slurm.list-interval=1s",
            f"--web.token-file={token}", f"--check.command={check}", f"--audit.file={tmp_path / 'audit.jsonl'}"))
        config = routing(tmp_path, receiver, TIME_SCALE)
        _remediate_receiver(config, remediate.url, token)
        am = stack.enter_context(alertmanager(tmp_path / "am", config))
        targets = tmp_path / "targets.json"
        layout = write(tmp_path / "layout.yml", LAYOUT)
        sim = stack.enter_context(simulator(targets, f"--nodes={len(NODES)}", "--seed=0", "--collect-interval=1s",
                                            f"--layout={layout}", "--cluster=e2e"))
        port = int(remediate.url.rsplit(":", 1)[1])
        prom = stack.enter_context(prometheus(prometheus_config(
            tmp_path / "prometheus.yml", targets, "1s", rules, am.url, own={"gpufleet-remediate": port},
            own_cluster="e2e"), tmp_path / "data"))
        wait_for(lambda: len(query(prom.url, "up == 1")) == len(NODES) + 1, 60, "the nodes and the remediator scraped")
        yield Stack(cluster, remediate, sim.url, prom.url)


def test_a_lost_gpu_drains_its_node_and_the_reboot_and_check_return_it(tmp_path):
    """Three lost GPUs: two drained by gpufleet (one fails its check after the reboot), one on a node an operator
    drained first. Each is a ticket; only the node that runs a job pages (GpuRepairUrgent), once, and the two idle
    ones, drained in time by gpufleet or before by the operator, page nobody. Beside them, a node in Slurm's
    maintenance reservation and a node in none reboot for ten production minutes, past NodeExporterDown's five:
    only the second pages, and no drain by gpufleet or for a fault counts as maintenance."""
    (tmp_path / f"fail-{NODES[1]}").touch()  # Its check fails after the reboot.
    receiver = Receiver()
    with _stack(tmp_path, receiver) as running:
        cluster, remediate, prom_url = running.cluster, running.remediate, running.prom_url
        cluster.run("scontrol", "update", f"NodeName={NODES[2]}", "State=DRAIN", f"Reason={OPERATOR}")
        _reboot_in_maintenance(running)
        for name in NODES[:3]:
            _fault(running.sim_url, kind="xid", node=name, gpu=0, xid=79)
        # Each repair drains its node within a production minute of its ticket: 7.5 s here.
        drained = {}
        for name in NODES[:2]:
            ticketed = wait_for(lambda name=name: receiver.first("ticket", "GpuNeedsReboot", name), 60,
                                f"the ticket for {name}")
            wait_for(lambda name=name: cluster.states()[name][0] in ("drained", "draining"), 30, f"{name} drained")
            drained[name] = (time.monotonic() - ticketed) * TIME_SCALE
            assert cluster.states()[name][1] == "gpufleet: GPU 0 needs its node rebooted (XID 79)"
        wait_for(lambda: own_metric(remediate.url, "gpufleet_remediate_actions_total", action="drain",
                                    result="operator_drained") == 1, 30, "the operator's drain seen")
        # The page names the jobs at stake on the lost GPU, as the exporter attributed them; their GPU-hours once
        # the jobs group has recorded a minute of them.
        stake = wait_for(lambda: _stake(prom_url, NODES[0], "GPU-hours"), 30, "the GPU-hours at stake")
        jobs = query(prom_url, f'gpufleet_gpu_job_info{{instance="{NODES[0]}",gpu="0",job_id!=""}}')
        for name in NODES[:3]:
            _fault(running.sim_url, kind="node_reboot", node=name, duration="8s")
        wait_for(lambda: cluster.states()[NODES[0]][0] == "idle", 90, "the repaired node resumed")
        wait_for(lambda: any(path == "ticket" and labels["alertname"] == "RemediationCheckFailed"
                             and labels["node"] == NODES[1] for path, labels in receiver.snapshot()), 90,
                 "the failed check's ticket")
        in_maintenance = {r["metric"]["instance"] for r in query(prom_url, "instance:gpufleet_node_maintenance:info")}
        wait_for(lambda: _triggers(receiver, "NodeExporterDown", PLAIN), 90, "the page for the plain reboot")
        wait_for(lambda: _firing(prom_url, "NodeExporterDown", MAINTAINED), 30, "the maintained node's alert")
        time.sleep(5)  # The pager's group_wait, and more: a page held back would have come by now.
        states = cluster.states()
        resolved = query(prom_url, 'ALERTS{alertname="GpuNeedsReboot"}')
        paged = {name: _triggers(receiver, "NodeExporterDown", name) for name in (PLAIN, MAINTAINED)}
        repairs_paged = {name: _incidents(receiver, name) for name in NODES[:3]}
        tickets = {name for name in NODES[:3] if receiver.first("ticket", "GpuNeedsReboot", name) is not None}
    print("ticket to drain, production seconds: " + ", ".join(f"{n} {s:.0f}" for n, s in drained.items()))
    print(f"jobs at stake on {NODES[0]}: {stake}")
    assert all(seconds <= 60 for seconds in drained.values()), drained
    assert states[NODES[1]][0] == "drained" and states[NODES[1]][1].startswith(
        "gpufleet: check failed after repair: check exited 1: checked " + NODES[1])
    assert states[NODES[2]] == ("drained", OPERATOR)
    assert states[MAINTAINED][0] == "maint" and in_maintenance == {MAINTAINED}, (states, in_maintenance)
    assert paged == {PLAIN: 1, MAINTAINED: 0}, f"NodeExporterDown pages: {paged}"
    assert tickets == set(NODES[:3]), tickets
    assert repairs_paged == {NODES[0]: 1, NODES[1]: 0, NODES[2]: 0}, f"pager incidents: {repairs_paged}"
    assert resolved == [], "GpuNeedsReboot still fires after the reboots"
    assert jobs, "the simulator's node 1 runs no job on GPU 0"
    job = jobs[0]["metric"]
    assert stake.startswith(f"Jobs on this GPU in the last 10m: {job['scheduler']} job {job['job_id']}, "), stake
    assert " GPU-hours in 30d" in stake, stake


def _stake(prom_url: str, instance: str, showing: str) -> str | None:
    """GpuNeedsReboot's jobs at stake on `instance`, once they show `showing`."""
    status, body = http("GET", f"{prom_url}/api/v1/alerts")
    assert status == 200, body
    stake = next(a["annotations"]["jobs_at_stake"] for a in json.loads(body)["data"]["alerts"]
                 if a["labels"]["alertname"] == "GpuNeedsReboot" and a["labels"]["instance"] == instance)
    return stake if showing in stake else None


def _reboot_in_maintenance(running: Stack) -> None:
    """MAINTAINED into a maintenance reservation, seen by the rules; then it and PLAIN down for ten production
    minutes."""
    running.cluster.run("scontrol", "create", "reservation", "ReservationName=reboot", "StartTime=now",
                        "Duration=60", f"Nodes={MAINTAINED}", "Flags=MAINT", f"Users={getpass.getuser()}")
    wait_for(lambda: _firing(running.prom_url, "NodeMaintenance", MAINTAINED), 60, "NodeMaintenance firing")
    for name in (MAINTAINED, PLAIN):
        _fault(running.sim_url, kind="node_reboot", node=name, duration=f"{600 / TIME_SCALE:g}s")


def _triggers(receiver: Receiver, alertname: str, instance: str) -> int:
    """How many times the pager was told `alertname` on `instance` began (a trigger naming it)."""
    return sum(page.action == "trigger" and any(a.get("alertname") == alertname and a.get("instance") == instance
                                                for a in page.alerts) for page in receiver.pages)


def _incidents(receiver: Receiver, instance: str) -> int:
    """How many pager incidents named `instance`."""
    return sum(any(a.get("instance") == instance for page in pages for a in page.alerts)
               for _, pages in receiver.incidents())


def _firing(prom_url: str, alertname: str, instance: str) -> bool:
    return bool(query(prom_url, f'ALERTS{{alertname="{alertname}",alertstate="firing",instance="{instance}"}}'))
