"""What the remediator reads: `scontrol show node -o` lines and Alertmanager's webhook body, without a Slurm."""

import asyncio
import re
import time
from pathlib import Path

import pytest

from gpufleet.remediate.check import Check
from gpufleet.remediate.slurm import parse_nodes, parse_reservations
from gpufleet.remediate.webhook import Refused, parse

NODE = re.compile(r"^(?P<node>[^:]+)")


def test_a_reason_keeps_its_spaces_and_equals_signs_and_loses_its_stamp():
    line = ("NodeName=gpu-node-0007 Arch=x86_64 CoresPerSocket=1 State=MIXED+DRAIN Partitions=gpu,debug "
            "BootTime=None Reason=ops: swap PSU, see ticket=4411 (rack B) [alice@2026-11-26T22:39:41]")
    [node] = parse_nodes(line).values()
    assert node.name == "gpu-node-0007" and node.partitions == ("gpu", "debug")
    assert node.states == {"MIXED", "DRAIN"} and node.drained and not node.ours
    assert node.reason == "ops: swap PSU, see ticket=4411 (rack B)"


def test_gpufleets_own_drain_is_told_by_its_reason_and_a_non_responding_node_by_its_flag():
    nodes = parse_nodes("NodeName=a State=IDLE*+DRAIN Reason=gpufleet: GPU 3 needs a reset (XID 79) [root@now]\n"
                        "NodeName=b State=IDLE Partitions=gpu\n")
    assert nodes["a"].ours and nodes["a"].states == {"IDLE", "DRAIN"} and not nodes["a"].responding
    assert not nodes["b"].drained and nodes["b"].reason == "" and nodes["b"].responding


def alert(**changes):
    return {"status": "firing", "fingerprint": "f1", "startsAt": "2026-11-26T10:00:00.123456789Z",
            "labels": {"alertname": "GpuNeedsReset", "instance": "gpu-node-0001:19400", "gpu": "3",
                       "remediation": "drain"},
            "annotations": {"remediation_reason": "GPU 3 needs a reset\n (XID 79)"}, **changes}


def test_a_reservation_gives_its_hostlist_its_local_end_and_whether_it_is_maintenance_held_now():
    text = ("ReservationName=psu StartTime=2026-11-28T08:29:33 EndTime=2026-11-28T09:29:33 Duration=01:00:00 "
            "Nodes=gpu-node-[0003-0005,0007] NodeCnt=4 Flags=MAINT,SPEC_NODES TRES=cpu=8 Users=root State=ACTIVE\n"
            "ReservationName=later EndTime=2026-11-28T10:29:33 Nodes=gpu-node-0001 Flags=MAINT State=INACTIVE\n"
            "ReservationName=forever EndTime=Unknown Nodes=gpu-node-0002 Flags=SPEC_NODES State=ACTIVE\n")
    psu, later, forever = parse_reservations(text)
    assert psu.hostlist == "gpu-node-[0003-0005,0007]" and psu.maintenance and psu.active
    assert psu.end == time.mktime((2026, 11, 28, 9, 29, 33, 0, 0, -1))  # scontrol writes the local time.
    assert later.maintenance and not later.active
    assert forever.end is None and not forever.maintenance
    assert parse_reservations("No reservations in the system\n") == []


def test_an_alert_names_its_node_its_episode_and_its_reason():
    [parsed] = parse({"version": "4", "alerts": [alert()]}, "instance", NODE)
    assert parsed.node == "gpu-node-0001" and parsed.firing and parsed.fingerprint == "f1"
    assert parsed.starts_at == pytest.approx(1795687200.123456)
    assert parsed.reason == "GPU 3 needs a reset (XID 79)"


@pytest.mark.parametrize(("body", "kind", "words"), [
    ([], "malformed", "not an Alertmanager webhook"),
    ({"version": "4", "alerts": [alert(status="pending")]}, "malformed", "status must be firing or resolved"),
    ({"version": "4", "alerts": [alert(startsAt="yesterday")]}, "malformed", "is not an RFC 3339 time"),
    ({"version": "4", "alerts": [alert(labels={"alertname": "X", "instance": "n"})]}, "unknown_alert",
     "remediation label None"),
    ({"version": "4", "alerts": [alert(labels={"alertname": "X", "remediation": "drain"})]}, "unknown_alert",
     "no node in its 'instance' label"),
    ({"version": "4", "alerts": [alert(), alert(fingerprint="")]}, "malformed",
     "alert 1 (GpuNeedsReset): no fingerprint"),
])
def test_a_body_with_one_bad_alert_is_refused_whole(body, kind, words):
    with pytest.raises(Refused) as refused:
        parse(body, "instance", NODE)
    assert refused.value.kind == kind and words in str(refused.value)


async def test_a_check_past_its_timeout_fails_and_leaves_nothing_it_started_running(tmp_path):
    pid_file = tmp_path / "child"
    check = Check(f"sh -c 'sleep 60 & echo $! > {pid_file}; wait'", timeout=0.5)
    started = time.monotonic()
    assert await check.run("gpu-node-0001") == (False, "check timed out after 0.5s")
    # Not when the child's output pipe closes at its own end: a minute later, or never for a hung diagnostic.
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    for _ in range(50):  # The kill is sent; the child's exit takes a moment to be reaped by init.
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"the check's child {child} still runs")
