"""The generated alerting rules: committed output up to date, clean for promtool, and unit-tested by it."""

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from gpufleet import cli
from gpufleet.alerts import capacity as rec
from gpufleet.alerts.cli import DCGM_RULES_FILE, RULES_FILE, VMALERT_RULES_FILE
from gpufleet.alerts.config import Config, load
from gpufleet.alerts.pipeline import WATCHDOG, WATCHDOG_SEVERITY
from gpufleet.alerts.rules import recorded_by, render
from gpufleet.devtools.delivery import Receiver, post_alerts, routing
from gpufleet.devtools.programs import alertmanager, binary
from gpufleet.devtools.waiting import wait_for
from gpufleet.report.capacity import CAPACITY
from gpufleet.xid import APPLICATION, RESET_OR_REBOOT, WATCH

TESTS = sorted((Path(__file__).parent.parent / "alerts" / "tests").glob("*.test.yml"))


def promtool() -> str:
    return binary("promtool")


def test_the_committed_rule_files_are_what_the_code_generates():
    assert RULES_FILE.read_text(encoding="utf-8") == render(), "run `gpufleet alerts build` and commit the result"
    assert VMALERT_RULES_FILE.read_text(encoding="utf-8") == render(engine="vmalert")
    assert DCGM_RULES_FILE.read_text(encoding="utf-8") == render(layer="dcgm")
    check = subprocess.run([sys.executable, "-m", "gpufleet", "alerts", "build", "--check"], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr


def test_vmalerts_file_is_prometheus_rules_with_the_pagers_groups_asking_rules_at_once():
    prometheus = yaml.safe_load(RULES_FILE.read_text())["groups"]
    vmalert = yaml.safe_load(VMALERT_RULES_FILE.read_text())["groups"]
    assert [{k: v for k, v in g.items() if k != "concurrency"} for g in vmalert] == prometheus
    # The pager's groups (no interval of their own) ask up to four rules at once, the two-rule group two; the
    # minute groups two; the capacity and reliability groups, which run every 5 or 10 minutes, one at a time, so
    # that they cannot crowd the pager out.
    wanted = {None: 4, "1m": 2}
    concurrency = {g["name"]: g["concurrency"] for g in vmalert}
    assert concurrency == {g["name"]: min(wanted.get(g.get("interval"), 1), len(g["rules"])) for g in prometheus}
    pagers = ("gpufleet-gpu-failures", "gpufleet-fabric", "gpufleet-maintenance")
    assert {concurrency[name] for name in pagers} == {4, 2}
    assert {concurrency[name] for name in ("gpufleet-recording", "gpufleet-stragglers", "gpufleet-fabric-trends",
                                           "gpufleet-reliability", "gpufleet-capacity-links")} == {2, 1}
    site = yaml.safe_load(render(load_config_text("vmalert_concurrency: 8\nvmalert_trend_concurrency: 3\n"),
                                 "vmalert"))["groups"]
    assert {g["name"]: g["concurrency"] for g in site if g["concurrency"] > 1} == {
        "gpufleet-gpu-failures": 8, "gpufleet-fabric": 7, "gpufleet-exporter": 4, "gpufleet-recording": 3,
        "gpufleet-stragglers": 3, "gpufleet-exporter-trends": 3, "gpufleet-gpu-trends": 3,
        "gpufleet-fabric-trends": 3, "gpufleet-pipeline": 2, "gpufleet-jobs": 3, "gpufleet-remediation": 3,
        "gpufleet-maintenance": 2, "gpufleet-maintenance-trends": 3, "gpufleet-bmc": 3}
    # Time-scaled (the end-to-end test), the minute groups run every 8 s and keep their concurrency.
    scaled = yaml.safe_load(render(Config().scaled(8), "vmalert"))["groups"]
    assert {g["name"]: g["concurrency"] for g in scaled} == concurrency


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["prometheus", "vmalert"])
def test_the_check_notices_a_stale_file(tmp_path, engine):
    stale = tmp_path / "rules.yml"
    stale.write_text(render(engine="prometheus" if engine == "vmalert" else "vmalert"))  # The other engine's.
    check = subprocess.run([sys.executable, "-m", "gpufleet", "alerts", "build", "--check", f"--output={stale}",
                            f"--engine={engine}"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and f"{stale} is out of date" in check.stderr, check.stderr
    built = subprocess.run([sys.executable, "-m", "gpufleet", "alerts", "build", f"--output={stale}",
                            f"--engine={engine}"], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0 and stale.read_text() == render(engine=engine), built.stderr


@pytest.mark.e2e
def test_promtool_checks_the_rules():
    for rules in (RULES_FILE, DCGM_RULES_FILE):
        result = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    # Why vmalert has a file of its own: Prometheus refuses the field that lets vmalert ask rules at once.
    refused = subprocess.run([promtool(), "check", "rules", str(VMALERT_RULES_FILE)], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "field concurrency not found" in refused.stdout + refused.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("scale", [1, 8], ids=["production", "time scale 8"])
def test_vmalert_loads_the_rules(tmp_path, scale):
    # Past one Prometheus the same rules run in vmalert, from its own copy of the file: its MetricsQL parser
    # and template checks take every expression and annotation as written. The broken copy shows that the
    # check reads them.
    vmalert = binary("vmalert")
    rules = tmp_path / "rules.yml"
    rules.write_text(render(Config().scaled(scale), "vmalert"))
    broken = tmp_path / "broken.yml"
    broken.write_text(rules.read_text().replace("expr: ", "expr: sum by (", 1))

    def dry_run(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([vmalert, "-dryRun", f"-rule={path}", "-loggerLevel=ERROR"], capture_output=True,
                              text=True, timeout=60)

    loaded = dry_run(rules)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    refused = dry_run(broken)
    assert refused.returncode != 0 and "gpufleet-" in refused.stdout + refused.stderr, refused.stdout + refused.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file):
    result = subprocess.run([promtool(), "test", "rules", str(test_file)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def alerting_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(render())["groups"] for rule in group["rules"] if "alert" in rule]


# A job's, a leaf switch's, the scrapers' and the alerting pipeline's own pages.
PAGES_WITHOUT_A_NODE = {"JobHung", "FabricLeafDown", "RackDown", "NodesUnscraped", "NodesStorageTimeouts",
                        "AlertmanagerNotificationsFailed", "RemediationBreakerOpen"}


def test_every_alert_carries_severity_summary_description_and_runbook():
    for rule in alerting_rules():
        assert rule["labels"]["severity"] in ({WATCHDOG_SEVERITY} if rule["alert"] == WATCHDOG else {
            "critical", "warning", "info"}), rule["alert"]
        # What `gpufleet remediate` acts on carries the reason its drain gives Slurm.
        remediation = {"remediation_reason"} if "remediation" in rule["labels"] else set()
        # Every page about a node or its GPUs names the jobs at stake.
        paged = rule["labels"]["severity"] == "critical" and rule["alert"] not in PAGES_WITHOUT_A_NODE
        stake = {"jobs_at_stake"} if paged else set()
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url", *remediation, *stake}, (
            rule["alert"])
        # A job's (`Job`), a rack's (`Rack`); the pipeline's own: Alertmanager's, the remediator's, and the
        # Watchdog, by the name heartbeat integrations know it by.
        prefixes = ("Gpu", "Nic", "Node", "Fabric", "Rack", "Job", "Alertmanager", "Remediation")
        assert rule["alert"].startswith(prefixes) or rule["alert"] == WATCHDOG



def test_each_xid_has_one_class():
    classes = [set(RESET_OR_REBOOT), set(WATCH), set(APPLICATION)]
    assert all(not (a & b) for i, a in enumerate(classes) for b in classes[i + 1:])
    assert {79, 48, 64, 95, 119, 144, 150} <= set(RESET_OR_REBOOT) and 63 in WATCH and 13 in APPLICATION


RUNBOOKS = Path(__file__).parent.parent / "docs" / "runbooks.md"


def runbook_sections() -> dict[str, str]:
    """Each section of the runbooks by its anchor (the heading, lower case), with its text."""
    parts = re.split(r"^## (\w+)\n", RUNBOOKS.read_text(), flags=re.M)
    return {name.lower(): text for name, text in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_runbook_url_points_at_a_section_of_the_runbooks():
    sections = runbook_sections()
    for rule in alerting_rules():
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in sections, rule["alert"]
    assert set(sections) == {rule["alert"].lower() for rule in alerting_rules()}, "runbooks of alerts that are gone"


def test_every_runbook_gives_its_alerts_severity_and_why():
    """A page is for what a person must do now; the runbook says why each alert pages, tickets or informs."""
    said = {"critical": "critical, pages", "warning": "warning, a ticket", "info": "info, reaches nobody",
            WATCHDOG_SEVERITY: "none, reaches the heartbeat service"}
    sections = runbook_sections()
    for rule in alerting_rules():
        text = sections[rule["alert"].lower()]
        match = re.match(r"\n\*\*Severity: ([^.]+)\.\*\* (\S.{20,})\n", text)
        assert match, f"{rule['alert']}: no severity line with its reason"
        severity = rule["labels"]["severity"]
        if rule["labels"].get("remediation") == "drain" and severity == "critical":  # Routed to a ticket.
            assert match.group(1) == "critical, a ticket, and GpuRepairUrgent pages for its node", rule["alert"]
        else:
            assert match.group(1) == said[severity], rule["alert"]


def test_every_alert_has_unit_tests_where_it_fires_and_where_it_must_not():
    fires, silent = set(), set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alerting_rules()}
    assert names - fires == set(), "alerts no unit test fires"
    assert names - silent - {WATCHDOG} == set(), "alerts no unit test shows silent"  # The Watchdog never is.


def test_recording_rules_follow_level_metric_operations():
    for group in yaml.safe_load(render())["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                level, metric, operations = rule["record"].split(":")
                assert level and metric.startswith("gpufleet_") and operations, rule["record"]


ROUTING = Path(__file__).parent.parent / "compose" / "alertmanager" / "alertmanager.yml"


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("amtool"), *args], capture_output=True, text=True,
                          timeout=60)


# Series of the capacity rules that exist only while there is something to count, and the report section that
# reads their absence as "none" (no GPU with errors, no straggler, no GPM, no node meter).
READ_AS_NONE = {
    "health": (rec.ECC, rec.REMAP_PENDING, rec.REMAP_FAILED, rec.LOST, rec.PCI_MISSING),
    "stragglers": (rec.STRAGGLING,),
    "utilisation": (rec.GPM_GPUS, rec.GPM_USED, rec.SM_ACTIVE, rec.TENSOR_ACTIVE),
    "energy": (rec.METERED_NODES, rec.NODE_POWER, rec.METERED_GPU_POWER),
}


@pytest.mark.parametrize("section", sorted(READ_AS_NONE))
def test_what_the_report_reads_as_none_is_recorded_beside_what_it_checks_first(section):
    """The report computes a section once the series it requires are there, and then reads a missing problem
    series as good news. Recorded by another capacity group, a Prometheus that loaded one group and not the
    other would report a fleet without a fault."""
    group_of = recorded_by(rec.capacity(Config()))
    [spec] = [spec for spec in CAPACITY.sections if spec.key == section]
    checked = {group_of[name] for need in spec.requires for name in need.split("|") if name in group_of}
    assert {name: group_of[name] for name in READ_AS_NONE[section] if group_of[name] not in checked} == {}


@pytest.mark.e2e
def test_amtool_checks_the_routing():
    result = amtool("check-config", str(ROUTING))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(("labels", "receiver"), [
    (["severity=critical", "alertname=GpuLost"], "pager"),
    (["severity=warning", "alertname=GpuRowRemapPending"], "ticket"),
    (["severity=info", "alertname=GpuXidApplication"], "nowhere"),
])
def test_severity_picks_the_receiver(labels, receiver):
    result = amtool("config", "routes", "test", f"--config.file={ROUTING}", *labels)
    assert result.stdout.strip() == receiver, result.stdout + result.stderr


@pytest.mark.e2e
def test_a_gpu_repair_goes_to_the_remediator_and_a_ticket_and_its_nodes_urgent_repair_pages():
    repair = amtool("config", "routes", "test", f"--config.file={ROUTING}", "severity=critical",
                    "alertname=GpuNeedsReset", "remediation=drain")
    assert repair.stdout.split() == ["remediate,ticket"], repair.stdout + repair.stderr
    urgent = amtool("config", "routes", "test", f"--config.file={ROUTING}", "severity=critical",
                    "alertname=GpuRepairUrgent")
    assert urgent.stdout.split() == ["pager"], urgent.stdout + urgent.stderr




@pytest.mark.e2e
def test_a_flapping_port_pages_as_a_flap_and_not_also_as_down(tmp_path):
    """A flapping link is down half the time, so "port down" can fire beside the flap's page (vmalert restarted
    during a flap restores its start from an earlier down): the flap holds it back at Alertmanager, for that
    port only. Another port of the node that is down still pages."""
    receiver = Receiver()
    node = {"alertname": "NicInfinibandPortDown", "cluster": "c", "instance": "n1", "port": "1",
            "severity": "critical"}
    flapping, down_too, other = ({**node, "alertname": "NicInfinibandLinkFlapping", "device": "mlx5_5"},
                                 {**node, "device": "mlx5_5"}, {**node, "device": "mlx5_4"})
    with alertmanager(tmp_path / "am", routing(tmp_path, receiver, time_scale=30)) as am:
        post_alerts(am.url, [flapping, down_too, other])
        wait_for(lambda: {"mlx5_4", "mlx5_5"} <= {labels["device"] for _, labels in receiver.snapshot()}, 30,
                 "the pages")
        time.sleep(2)  # The pager's group_wait, once more: a held-back alert would have come with the others.
    assert sorted((path, labels["alertname"], labels["device"]) for path, labels in receiver.snapshot()) == [
        ("pager", "NicInfinibandLinkFlapping", "mlx5_5"), ("pager", "NicInfinibandPortDown", "mlx5_4")]


@pytest.mark.slow
@pytest.mark.e2e
def test_every_alert_of_the_rules_routes_by_its_severity():
    """By its severity, and a repair (`remediation="drain"`) to the remediator and a ticket whatever its severity:
    GpuRepairUrgent says when a repair also pages."""
    expected = {"critical": "pager", "warning": "ticket", "info": "nowhere", WATCHDOG_SEVERITY: "heartbeat"}
    for rule in alerting_rules():
        labels = rule["labels"]
        result = amtool("config", "routes", "test", f"--config.file={ROUTING}", f"alertname={rule['alert']}",
                        *(f"{name}={value}" for name, value in labels.items()))
        wanted = "remediate,ticket" if labels.get("remediation") == "drain" else expected[labels["severity"]]
        assert result.stdout.strip() == wanted, rule["alert"]


def test_the_routing_keeps_secrets_out_of_the_repository():
    config = yaml.safe_load(ROUTING.read_text())
    for receiver in config["receivers"]:
        for pager in receiver.get("pagerduty_configs", []):
            assert "routing_key" not in pager and "service_key" not in pager and pager["routing_key_file"]


@pytest.mark.parametrize("command", [["alerts", "build"], ["dashboards", "build"],
                                     ["report", "capacity", "--prometheus=http://127.0.0.1:1"]])
@pytest.mark.parametrize(("text", "message"), [
    ("cluster_label: site\ncolour: red\n", "unknown key 'colour'; the keys are alertmanager_job, alerts, busy"),
    ("alerts: [GpuLost]\n", "alerts must map alert names to their changes"),
    ("alerts:\n  GpuLost: {severity: page}\n", "alerts: GpuLost: severity must be one of critical, warning, info"),
    ("alerts:\n  GpuLost: {mute: true}\n", "alerts: GpuLost: unknown key 'mute'"),
    ("alerts:\n  GpuLost: {labels: {severity: info}}\n", "alerts: GpuLost: labels must map label names (not"),
    ("saturation_warning: high\n", "saturation_warning must be a number, not 'high'"),
    ("straggler_for: soon\n", "straggler_for: invalid duration 'soon'"),
    ("cluster_label: 'data centre'\n", "cluster_label 'data centre' is not a Prometheus label name"),
    ("vmalert_concurrency: 0\n", "vmalert_concurrency must be 1 or more, not 0"),
    ("vmalert_trend_concurrency: -1\n", "vmalert_trend_concurrency must be 1 or more, not -1"),
    ("[1, 2]\n", "expected a mapping of settings"),
])
def test_every_builder_checks_its_config_file_key_by_key(tmp_path, capsys, command, text, message):
    config = tmp_path / "site.yml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit:
        cli.main([*command, f"--config={config}", f"--output={tmp_path / 'out'}"] if command[0] != "report"
                 else [*command, f"--config={config}", f"--out={tmp_path / 'out'}"])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def load_config_text(text: str) -> Config:
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as handle:
        handle.write(text)
        handle.flush()
        return load(handle.name)


def test_a_site_changes_an_alerts_severity_labels_or_presence_without_editing_generated_files(tmp_path, capsys):
    site = load_config_text("alerts:\n  GpuNeedsReplacement: {severity: info, labels: {team: hardware}}\n"
                            "  NicInfinibandRateDegraded: {disabled: true}\n")
    built = {r["alert"]: r for g in yaml.safe_load(render(site))["groups"] for r in g["rules"] if "alert" in r}
    assert built["GpuNeedsReplacement"]["labels"] == {"severity": "info", "team": "hardware", "remediation": "drain"}
    assert "NicInfinibandRateDegraded" not in built
    assert {name: rule for name, rule in built.items() if name != "GpuNeedsReplacement"} == {
        name: rule for name, rule in ((r["alert"], r) for r in alerting_rules())
        if name not in ("GpuNeedsReplacement", "NicInfinibandRateDegraded")}
    config = tmp_path / "site.yml"
    config.write_text("alerts:\n  GpuEccUncorrectible: {disabled: true}\n")
    assert cli.main(["alerts", "build", f"--config={config}", f"--output={tmp_path / 'out'}"]) == 2
    assert "GpuEccUncorrectible: no such alert; the alerts are " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_config_file_changes_what_is_built_and_nothing_else():
    site = load_config_text("cluster_label: site\nselector: 'job=\"gpu-nodes\"'\nsaturation_warning: 0.85\n"
                            "straggler_for: 1200\n")  # Seconds, as the duration grammar allows: `20m` in PromQL.
    rules = render(site)
    assert "cluster" not in re.sub(r"cluster(_(name|job)(_bucket)?)?:", "", rules)  # Recorded names keep `cluster`.
    assert 'gpufleet_gpu_up{job="gpu-nodes"}' in rules and "> 0.85" in rules
    [straggler] = [r for g in yaml.safe_load(rules)["groups"] for r in g["rules"] if r.get("alert") == "NodeStraggler"]
    assert "count_over_time(job_instance:gpufleet_straggler_score:slow[21m30s]) > 20" in straggler["expr"]
    assert render(Config()) == RULES_FILE.read_text(encoding="utf-8")
