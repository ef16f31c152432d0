"""Planned work pages nobody: `gpufleet maintenance` silences against the real Alertmanager with the production
routing, NodeMaintenance's inhibition there, and the command's answers to bad input."""

from __future__ import annotations

import datetime
import time

import pytest

from gpufleet import cli
from gpufleet.devtools.delivery import Receiver, post_alerts, routing
from gpufleet.devtools.net import http
from gpufleet.devtools.programs import alertmanager
from gpufleet.devtools.waiting import wait_for

pytestmark = pytest.mark.e2e
TIME_SCALE = 30  # The routing's group_interval of 5m is 10 s.


def _down(instance: str, leaf: str, **labels: str) -> dict[str, str]:
    return {"alertname": "NodeExporterDown", "severity": "critical", "cluster": "c", "instance": instance,
            "leaf": leaf, "rack": "r1", **labels}


def _paged(receiver: Receiver, cluster: str = "c") -> set[tuple[str, str]]:
    """(alertname, instance or leaf) of every alert of `cluster` the pager heard of as firing."""
    return {(alert["alertname"], alert.get("instance") or alert.get("leaf", "")) for page in receiver.pages
            if page.action == "trigger" for alert in page.alerts if alert["cluster"] == cluster}


def _resolve(am_url: str, labels: dict[str, str]) -> None:
    """The alert resolved, as a rule engine says it: an end in the past."""
    ended = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)).isoformat()
    status, answer = http("POST", f"{am_url}/api/v2/alerts", [{"labels": labels, "endsAt": ended}])
    assert status == 200, answer


def test_a_leaf_in_maintenance_and_a_node_the_scheduler_holds_page_nobody_until_they_return(tmp_path, capsys):
    """A silence made with `gpufleet maintenance start --leaf` holds back the leaf's own page and its nodes', and
    nothing of another leaf; NodeMaintenance holds back its node's page and no other node's. Ended, each lets
    through what still fires."""
    receiver = Receiver()
    leaf_down = {"alertname": "FabricLeafDown", "severity": "critical", "cluster": "c", "leaf": "L1",
                 "device": "mlx5_0"}
    behind_leaf, elsewhere = _down("n1:19400", "L1"), _down("n3:19400", "L2")
    held, other = _down("n4:19400", "L2"), _down("n5:19400", "L2")
    maintenance = {"alertname": "NodeMaintenance", "severity": "info", "cluster": "c", "instance": "n4:19400",
                   "leaf": "L2", "rack": "r1"}
    with alertmanager(tmp_path / "am", routing(tmp_path, receiver, TIME_SCALE)) as am:
        flags = [f"--alertmanager.url={am.url}"]
        assert cli.main(["maintenance", "start", *flags, "--leaf=L1", "--reason=leaf firmware 3.2",
                         "--for=2h", "--author=ops"]) == 0
        silence_id = capsys.readouterr().out.split()[0]
        post_alerts(am.url, [maintenance])
        time.sleep(1)  # The source of an inhibition must be there before what it holds back.
        post_alerts(am.url, [leaf_down, behind_leaf, elsewhere, held, other])
        wait_for(lambda: {("NodeExporterDown", "n3:19400"), ("NodeExporterDown", "n5:19400")} <= _paged(receiver),
                 30, "the pages of nodes in no maintenance")
        time.sleep(2)  # The pager's group_wait, once more: a page held back would have come with the others.
        during = _paged(receiver)
        assert cli.main(["maintenance", "list", *flags]) == 0
        listed = capsys.readouterr().out
        assert cli.main(["maintenance", "end", *flags, "--leaf=L1"]) == 0
        _resolve(am.url, maintenance)
        wait_for(lambda: {("FabricLeafDown", "L1"), ("NodeExporterDown", "n1:19400"),
                          ("NodeExporterDown", "n4:19400")} <= _paged(receiver), 60, "the pages after maintenance")
    assert during == {("NodeExporterDown", "n3:19400"), ("NodeExporterDown", "n5:19400")}, during
    assert listed.startswith(f"{silence_id}  until ") and '{leaf="L1"}  by ops: leaf firmware 3.2' in listed, listed


def test_a_node_silence_matches_its_instance_with_or_without_the_exporters_port(tmp_path, capsys):
    receiver = Receiver()
    with alertmanager(tmp_path / "am", routing(tmp_path, receiver, TIME_SCALE)) as am:
        flags = [f"--alertmanager.url={am.url}"]
        assert cli.main(["maintenance", "start", *flags, "--node=gpu-node-0001", "--node=gpu.node-0002",
                         "--cluster=c", "--reason=RMA 5120", "--until=2099-01-01T00:00:00Z"]) == 0
        capsys.readouterr()
        post_alerts(am.url, [_down("gpu-node-0001:19400", "L1"), _down("gpu.node-0002", "L1"),
                             _down("gpu-node-00010:19400", "L1"), _down("gpuxnode-0002", "L1"),
                             _down("gpu-node-0001:19400", "L1", cluster="d")])
        wait_for(lambda: len(_paged(receiver)) >= 2 and _paged(receiver, "d"), 30, "the pages of the other nodes")
        time.sleep(2)
        paged, elsewhere = _paged(receiver), _paged(receiver, "d")
        assert cli.main(["maintenance", "end", *flags, "--node=gpu-node-0001", "--node=gpu.node-0002",
                         "--cluster=c"]) == 0
        assert cli.main(["maintenance", "end", *flags, "--node=gpu-node-0001", "--node=gpu.node-0002",
                         "--cluster=c"]) == 1
    assert paged == {("NodeExporterDown", "gpu-node-00010:19400"), ("NodeExporterDown", "gpuxnode-0002")}, paged
    assert elsewhere == {("NodeExporterDown", "gpu-node-0001:19400")}, elsewhere
    assert "no maintenance of node gpu-node-0001, gpu.node-0002 is in force" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["start", "--leaf=L1", "--for=1h"], "the following arguments are required: --reason"),
    (["start", "--leaf=L1", "--reason=x", "--for=0s"], "duration '0s' must be greater than zero"),
    (["start", "--leaf=L1", "--reason=x", "--until=2026-01-01T00:00"], "has no time zone"),
    (["start", "--leaf=L1", "--rack=R1", "--reason=x", "--for=1h"], "not allowed with argument --leaf"),
    (["start", "--reason=x", "--for=1h"], "one of the arguments --node --leaf --rack is required"),
])
def test_bad_flags_are_usage_errors_that_say_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["maintenance", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["start", "--leaf=L1", "--reason=x", "--until=2001-01-01T00:00Z"], "--until 2001-01-01T00:00:00+00:00 has passed"),
    (["start", "--leaf=L1", "--reason= ", "--for=1h"], "--reason must say why"),
    (["start", "--leaf=L1", "--reason=x", "--for=1h"], "cannot reach Alertmanager at http://127.0.0.1:1"),
    (["list"], "cannot reach Alertmanager at http://127.0.0.1:1"),
    (["end", "abc", "--leaf=L1"], "give either silence IDs or one of --node, --leaf, --rack"),
])
def test_what_cannot_be_done_is_said_and_exits_1(argv, message, capsys):
    assert cli.main(["maintenance", *argv, "--alertmanager.url=http://127.0.0.1:1"]) == 1
    assert f"gpufleet maintenance: error: {message}" in capsys.readouterr().err


def test_a_user_without_a_name_must_say_who_declares_it(monkeypatch, capsys):
    """In a container whose user has no passwd entry and no LOGNAME, `getpass` has no name to give."""
    def nameless() -> str:
        raise KeyError("getpwuid(): uid not found: 4242")

    monkeypatch.setattr("getpass.getuser", nameless)
    argv = ["maintenance", "start", "--leaf=L1", "--reason=x", "--for=1h", "--alertmanager.url=http://127.0.0.1:1"]
    assert cli.main(argv) == 1
    assert "--author must name who declares it" in capsys.readouterr().err
    assert cli.main([*argv, "--author=ops"]) == 1  # Past the author: to the unreachable Alertmanager.
    assert "cannot reach Alertmanager" in capsys.readouterr().err
