"""`gpufleet remediate` against a real Slurm (Debian's munged, slurmctld and slurmd on loopback): what it drains,
resumes and refuses, seen in `sinfo` and on its /metrics."""

from __future__ import annotations

import datetime
import getpass
import json
import signal
import subprocess
import time

import pytest

from gpufleet.devtools.net import get, http
from gpufleet.devtools.programs import binary, remediator
from gpufleet.devtools.prom import own_metric
from gpufleet.devtools.slurm import Slurm, slurm
from gpufleet.devtools.waiting import wait_for

pytestmark = pytest.mark.e2e

NODES = [f"gpu-node-{number:04d}" for number in range(1, 9)]
RESET = "GPU 3 needs a reset (XID 79)"


def hours_ago(hours: float) -> str:
    """An RFC 3339 start `hours` before now, with nanoseconds as Alertmanager writes them: the remediator forgets
    resolved episodes after a day, so an alert's start is always recent."""
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=hours)
    return at.strftime("%Y-%m-%dT%H:%M:%S.123456789Z")


EPISODE = hours_ago(3)  # The start of an alert's first episode.


def alert(node: str, status: str = "firing", gpu: str = "3", starts: str = EPISODE,
          name: str = "GpuNeedsReset", **labels: str) -> dict:
    return {"status": status, "fingerprint": f"{name}-{node}-{gpu}", "startsAt": starts,
            "endsAt": "0001-01-01T00:00:00Z",
            "labels": {"alertname": name, "instance": f"{node}:19400", "gpu": gpu, "remediation": "drain",
                       "severity": "critical", **labels},
            "annotations": {"remediation_reason": f"GPU {gpu} needs a reset (XID 79)"}}


def post(url: str, *alerts: dict, token: str | None = None, body: object = None) -> int:
    payload = body if body is not None else {"version": "4", "status": "firing", "alerts": list(alerts)}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, _ = http("POST", f"{url}/webhook", payload, headers=headers)
    return status


def ours(cluster: Slurm) -> dict[str, str]:
    """The nodes drained with gpufleet's reason, and the reason."""
    return {name: reason for name, (state, reason) in cluster.states().items() if reason.startswith("gpufleet: ")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Slurm:
    with slurm(tmp_path_factory.mktemp("slurm"), NODES, daemons=len(NODES)) as running:
        yield running


@pytest.fixture(autouse=True)
def resumed(cluster):
    """Every node back in service before each test."""
    yield
    for name, (state, _) in cluster.states().items():
        if "drain" in state:  # UNDRAIN: a node whose slurmd never registered cannot RESUME.
            cluster.run("scontrol", "update", f"NodeName={name}", "State=UNDRAIN")


def test_a_gpu_needing_a_reset_drains_its_node_once_and_the_repair_and_check_resume_it(cluster, tmp_path):
    audit = tmp_path / "audit.jsonl"
    check = f"sh -c 'echo diag of {{node}}: pass; test ! -e {tmp_path}/fail'"
    with remediator(cluster.env, "--no-dry-run", f"--check.command={check}", f"--audit.file={audit}") as r:
        for _ in range(3):  # Alertmanager sends a group again at each group_interval.
            assert post(r.url, alert(NODES[0])) == 200
        wait_for(lambda: NODES[0] in ours(cluster), 10, "the drain")
        assert ours(cluster) == {NODES[0]: f"gpufleet: {RESET}"}
        assert cluster.states()[NODES[0]][0] == "drained"
        time.sleep(2)  # Two more passes: nothing more to do while the alert fires.
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="drain", result="ok") == 1
        assert own_metric(r.url, "gpufleet_remediate_drained_nodes") == 1
        assert post(r.url, alert(NODES[0], "resolved")) == 200
        wait_for(lambda: cluster.states()[NODES[0]][0] == "idle", 10, "the resume")
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="resume", result="ok") == 1
        assert own_metric(r.url, "gpufleet_remediate_drained_nodes") == 0
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["action"], e["result"]) for e in entries] == [
        ("alert", "firing"), ("drain", "ok"), ("alert", "resolved"), ("check", "ok"), ("resume", "ok")]
    assert entries[1]["alerts"] == {f"GpuNeedsReset-{NODES[0]}-3": RESET}
    assert entries[0]["alert"]["labels"]["alertname"] == "GpuNeedsReset"
    assert entries[3]["why"] == f"diag of {NODES[0]}: pass"


def test_a_failed_check_keeps_the_node_drained_and_says_why(cluster, tmp_path):
    (tmp_path / "fail").touch()
    check = f"sh -c 'echo dcgmi diag: memory test failed; test ! -e {tmp_path}/fail'"
    with remediator(cluster.env, "--no-dry-run", f"--check.command={check}") as r:
        post(r.url, alert(NODES[1]))
        wait_for(lambda: NODES[1] in ours(cluster), 10, "the drain")
        post(r.url, alert(NODES[1], "resolved"))
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_check_failed", node=NODES[1]) == 1, 10,
                 "the failed check")
        assert ours(cluster) == {NODES[1]: "gpufleet: check failed after repair: check exited 1: dcgmi diag: "
                                           "memory test failed"}
        assert cluster.states()[NODES[1]][0] == "drained"
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="check", result="failed") == 1
        # The operator mends it and resumes it: gpufleet lets it go.
        cluster.run("scontrol", "update", f"NodeName={NODES[1]}", "State=RESUME")
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_check_failed", node=NODES[1]) == 0, 10, "the release")
        assert cluster.states()[NODES[1]][0] == "idle"


def test_an_operators_drain_is_never_undone(cluster, tmp_path):
    operator = "ops: fan 2 replaced, burn-in (ticket 4411)"
    cluster.run("scontrol", "update", f"NodeName={NODES[2]}", "State=DRAIN", f"Reason={operator}")
    with remediator(cluster.env, "--no-dry-run", "--check.command=true") as r:
        post(r.url, alert(NODES[2]), alert(NODES[3]))
        wait_for(lambda: NODES[3] in ours(cluster), 10, "the drain of the other node")
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_actions_total", action="drain",
                               result="operator_drained") == 1, 10, "the operator's drain seen")
        # An operator takes over a node gpufleet drained, with a reason of their own; Alertmanager repeats the
        # firing alerts, which must not take it back.
        cluster.run("scontrol", "update", f"NodeName={NODES[3]}", "State=DRAIN", f"Reason={operator}")
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_nodes", phase="drained") == 0, 10, "the release")
        post(r.url, alert(NODES[2]), alert(NODES[3]))
        post(r.url, alert(NODES[2], "resolved"), alert(NODES[3], "resolved"))
        time.sleep(3)
        assert cluster.states()[NODES[2]] == ("drained", operator)
        assert cluster.states()[NODES[3]] == ("drained", operator)
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="resume", result="ok") == 0


def test_dry_run_by_default_counts_and_audits_but_changes_nothing(cluster, tmp_path):
    audit = tmp_path / "audit.jsonl"
    with remediator(cluster.env, f"--audit.file={audit}") as r:
        post(r.url, alert(NODES[4]))
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_actions_total", action="drain", result="dry_run") == 1,
                 10, "the dry-run drain")
        post(r.url, alert(NODES[4], "resolved"))
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_actions_total", action="resume", result="dry_run") == 1,
                 10, "the dry-run resume")
        assert own_metric(r.url, "gpufleet_remediate_dry_run") == 1
    assert ours(cluster) == {} and cluster.states()[NODES[4]][0] != "drained"
    assert [(e["action"], e["result"], e["dry_run"]) for e in map(json.loads, audit.read_text().splitlines())
            if e["action"] != "alert"] == [("drain", "dry_run", True), ("resume", "dry_run", True)]


def test_webhooks_out_of_order_drain_nothing_they_should_not(cluster):
    with remediator(cluster.env, "--no-dry-run") as r:
        # The resolve of an episode arrives before its firing: the firing is stale.
        post(r.url, alert(NODES[5], "resolved"))
        post(r.url, alert(NODES[5]))
        # An older episode's firing after a newer one resolved: stale too.
        post(r.url, alert(NODES[6], starts=hours_ago(2)))
        post(r.url, alert(NODES[6], "resolved", starts=hours_ago(2)))
        post(r.url, alert(NODES[6], starts=EPISODE))
        time.sleep(3)
        assert ours(cluster) == {}
        assert own_metric(r.url, "gpufleet_remediate_nodes", phase="drained") == 0


@pytest.mark.parametrize(("body", "headers", "status", "result"), [
    ("not json", None, 400, "malformed"),
    ({"alerts": "x"}, None, 400, "malformed"),
    ({"version": "4", "alerts": [{**alert(NODES[7]), "labels": {"alertname": "GpuTemperatureHigh",
                                                                 "instance": NODES[7]}}]}, None, 422, "unknown_alert"),
    ({"version": "4", "alerts": [alert("gpu-node-9999")]}, None, 422, "unknown_node"),
    ({"version": "4", "alerts": [alert(NODES[7])]}, "Bearer wrong", 401, "unauthorized"),
    ({"version": "4", "alerts": [alert(NODES[7])]}, None, 401, "unauthorized"),
])
def test_bad_input_is_refused_with_a_status_a_count_and_no_drain(guarded, cluster, body, headers, status, result):
    authorised = {"Authorization": headers} if headers else {}
    if headers is None and result != "unauthorized":
        authorised = {"Authorization": "Bearer s3cret"}
    before = own_metric(guarded.url, "gpufleet_remediate_webhooks_total", result=result)
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    answer, text = http("POST", f"{guarded.url}/webhook", raw=data, headers=authorised)
    assert answer == status, text
    assert own_metric(guarded.url, "gpufleet_remediate_webhooks_total", result=result) == before + 1
    time.sleep(1.5)  # A pass and more: what it would have drained, it would have by now.
    assert ours(cluster) == {}
    assert f"webhook refused ({result})" in guarded.output()


@pytest.fixture(scope="module")
def guarded(cluster, tmp_path_factory):
    """A remediator that acts, behind a bearer token, once it has Slurm's node list."""
    token = tmp_path_factory.mktemp("token") / "token"
    token.write_text("s3cret\n")
    with remediator(cluster.env, "--no-dry-run", f"--web.token-file={token}") as r:
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_slurm_nodes") == len(NODES), 10, "Slurm's node list")
        yield r


def test_a_hung_controller_is_retried_with_backoff_and_the_drain_is_not_lost(cluster):
    with remediator(cluster.env, "--no-dry-run", "--slurm.timeout=1s", "--slurm.retry-max=2s") as r:
        cluster.controller.send_signal(signal.SIGSTOP)
        try:
            post(r.url, alert(NODES[7]))
            wait_for(lambda: own_metric(r.url, "gpufleet_remediate_slurm_errors_total") >= 2, 20, "failed Slurm calls")
            assert own_metric(r.url, "gpufleet_remediate_slurm_up") == 0
        finally:
            cluster.controller.send_signal(signal.SIGCONT)
        wait_for(lambda: NODES[7] in ours(cluster), 20, "the drain, once Slurm answers")
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_slurm_up") == 1, 10, "slurm_up")
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="drain", result="ok") == 1
        assert "tried again in" in r.output()


def test_a_restart_keeps_the_nodes_it_holds_and_a_corrupt_state_file_is_set_aside(cluster, tmp_path):
    state = tmp_path / "state.json"
    with remediator(cluster.env, "--no-dry-run", f"--state.file={state}") as r:
        post(r.url, alert(NODES[0]))
        wait_for(lambda: NODES[0] in ours(cluster), 10, "the drain")
    with remediator(cluster.env, "--no-dry-run", f"--state.file={state}") as r:
        assert own_metric(r.url, "gpufleet_remediate_drained_nodes") == 1
        post(r.url, alert(NODES[0], "resolved"))
        wait_for(lambda: cluster.states()[NODES[0]][0] == "idle", 10, "the resume after the restart")
    state.write_text("{not json")
    with remediator(cluster.env, "--no-dry-run", f"--state.file={state}") as r:
        post(r.url, alert(NODES[1]))
        wait_for(lambda: NODES[1] in ours(cluster), 10, "a drain after a corrupt state file")
        log = r.output()
    assert f"state file {state} unreadable" in log and (tmp_path / "state.json.corrupt").read_text() == "{not json"


@pytest.fixture(scope="module")
def partition(tmp_path_factory) -> Slurm:
    """A 64-node partition whose daemons have not registered: Slurm drains such nodes all the same."""
    with slurm(tmp_path_factory.mktemp("slurm64"), [f"gpu-node-{n:04d}" for n in range(1, 65)], daemons=0) as s:
        yield s


def test_the_breaker_holds_twenty_faults_in_a_partition_to_its_limit(partition):
    faulty = partition.nodes[::3][:20]
    with remediator(partition.env, "--no-dry-run", "--breaker.max-nodes=5") as r:
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_slurm_nodes") == 64, 10, "Slurm's node list")
        post(r.url, *(alert(node) for node in faulty))
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_breaker_open") == 1, 20, "the breaker")
        time.sleep(3)  # Passes enough for every node wanted.
        assert len(ours(partition)) == 5
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="drain", result="ok") == 5
        assert own_metric(r.url, "gpufleet_remediate_actions_total", action="drain", result="breaker") == 15
        assert own_metric(r.url, "gpufleet_remediate_nodes", phase="wanted") == 15
        # An operator who has looked closes it: the next drains go up to the limit again.
        status, _ = http("POST", f"{r.url}/-/breaker/close")
        assert status == 200
        wait_for(lambda: len(ours(partition)) == 10, 20, "five more drains")
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_breaker_open") == 1, 10, "the breaker again")


def test_an_operator_who_resumes_a_node_is_not_overruled_by_the_alerts_repeats(cluster):
    with remediator(cluster.env, "--no-dry-run", "--breaker.max-share=0.5") as r:  # Two drains of 8 nodes.
        post(r.url, alert(NODES[4]))
        wait_for(lambda: NODES[4] in ours(cluster), 10, "the drain")
        cluster.run("scontrol", "update", f"NodeName={NODES[4]}", "State=RESUME")
        wait_for(lambda: own_metric(r.url, "gpufleet_remediate_nodes", phase="drained") == 0, 10, "the release")
        post(r.url, alert(NODES[4]))  # Alertmanager's repeat of the same episode.
        time.sleep(3)
        assert cluster.states()[NODES[4]][0] == "idle"
        post(r.url, alert(NODES[4], starts=hours_ago(1)))  # The GPU fails again: a new episode.
        wait_for(lambda: NODES[4] in ours(cluster), 10, "the drain of the new episode")


def test_its_own_metrics_pass_promtool(guarded):
    post(guarded.url, alert("gpu-node-9999"))  # A refusal at least, so that the counters have samples.
    text = get(f"{guarded.url}/metrics").decode()
    check = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=30)
    assert "gpufleet_remediate_webhooks_total" in text
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


def test_slurms_view_of_each_node_is_served_for_the_rules_to_tell_planned_work_from_faults(cluster):
    """A maintenance reservation (Slurm flags its nodes MAINTENANCE), an operator's drain with its reason, a node
    set down, and a drain by gpufleet, each on /metrics as Slurm lists it, and gone from it once Slurm no longer
    says so."""
    user = getpass.getuser()  # The Slurm user of the test's cluster, whose reservation it may make.
    cluster.run("scontrol", "create", "reservation", "ReservationName=psu-swap", "StartTime=now", "Duration=60",
                f"Nodes={NODES[5]}", "Flags=MAINT", f"Users={user}")
    cluster.run("scontrol", "update", f"NodeName={NODES[6]}", "State=DRAIN", "Reason=maintenance: driver 580")
    cluster.run("scontrol", "update", f"NodeName={NODES[7]}", "State=DOWN", "Reason=cabling")
    try:
        with remediator(cluster.env, "--no-dry-run", "--slurm.list-interval=1s") as r:
            post(r.url, alert(NODES[4]))
            wait_for(lambda: NODES[4] in ours(cluster), 10, "the drain")
            state = "gpufleet_slurm_node_state"
            # slurmctld flags a reservation's nodes MAINTENANCE at its next pass over them, seconds after it starts.
            wait_for(lambda: own_metric(r.url, state, node=NODES[5], state="maintenance") == 1, 30, "MAINTENANCE")
            served = {(n, s) for n in NODES[4:] for s in ("maintenance", "drain", "down", "idle")
                      if own_metric(r.url, state, node=n, state=s) == 1}
            reasons = {n: own_metric(r.url, "gpufleet_slurm_node_reason_info", node=n, reason=why)
                       for n, why in ((NODES[4], "gpufleet: " + RESET), (NODES[6], "maintenance: driver 580"),
                                      (NODES[7], "cabling"))}
            cluster.run("scontrol", "delete", "ReservationName=psu-swap")
            wait_for(lambda: own_metric(r.url, state, node=NODES[5], state="maintenance") == 0, 30,
                     "the reservation's end")
    finally:
        cluster.run("scontrol", "delete", "ReservationName=psu-swap", check=False)
        cluster.run("scontrol", "update", f"NodeName={NODES[7]}", "State=RESUME")
    assert served == {(NODES[4], "idle"), (NODES[4], "drain"), (NODES[5], "idle"), (NODES[5], "maintenance"),
                      (NODES[6], "idle"), (NODES[6], "drain"), (NODES[7], "down")}, served
    assert reasons == {NODES[4]: 1, NODES[6]: 1, NODES[7]: 1}, reasons


def test_a_maintenance_reservations_end_is_kept_while_its_node_stays_out_of_service_after_it(cluster, tmp_path):
    """The stated end of a maintenance reservation is served for its node while the reservation holds it, kept
    once the reservation is gone while Slurm keeps the node drained for the work (NodeMaintenanceOverdue's case),
    across a restart of the remediator, and forgotten once the node is back in service; a plain reservation states
    no maintenance end."""
    user, node, plain = getpass.getuser(), NODES[5], NODES[6]
    end, flags = "gpufleet_slurm_node_maintenance_end_timestamp_seconds", ("--slurm.list-interval=1s",
                                                                           f"--state.file={tmp_path / 'state.json'}")
    stated = time.time() + 3600
    cluster.run("scontrol", "create", "reservation", "ReservationName=hbm-swap", "StartTime=now", "Duration=60",
                f"Nodes={node}", "Flags=MAINT", f"Users={user}")
    cluster.run("scontrol", "create", "reservation", "ReservationName=bench", "StartTime=now", "Duration=60",
                f"Nodes={plain}", f"Users={user}")
    try:
        with remediator(cluster.env, *flags) as r:
            wait_for(lambda: own_metric(r.url, end, node=node) > 0, 30, "the reservation's end")
            served = own_metric(r.url, end, node=node)
            cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=maintenance: HBM swap")
            cluster.run("scontrol", "delete", "ReservationName=hbm-swap")
            wait_for(lambda: own_metric(r.url, "gpufleet_slurm_node_state", node=node, state="maintenance") == 0, 30,
                     "the reservation gone")
            time.sleep(2)  # Two more listings.
            kept = own_metric(r.url, end, node=node)
            plain_end = own_metric(r.url, end, node=plain)
        with remediator(cluster.env, *flags) as r:
            wait_for(lambda: own_metric(r.url, "gpufleet_remediate_slurm_nodes") > 0, 30, "the first listing")
            restarted = own_metric(r.url, end, node=node)
            cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
            wait_for(lambda: own_metric(r.url, end, node=node) == 0, 30, "the end forgotten once the node returns")
    finally:
        for name in ("hbm-swap", "bench"):
            cluster.run("scontrol", "delete", f"ReservationName={name}", check=False)
        cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    assert abs(served - stated) < 120, (served, stated)
    assert kept == restarted == served and plain_end == 0, (kept, restarted, plain_end)
