"""deploy/kubernetes/: rendered by a real kubectl's kustomize, every object validated against Kubernetes' OpenAPI
schemas (kubernetes-validate) and the Prometheus Operator's CRDs (tests/fixtures/prometheus-operator), the
PrometheusRule checked by promtool with the rule files' unit tests, and the AlertmanagerConfig routed as compose's
Alertmanager is."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpufleet.alerts.cli import DCGM_RULES_FILE, RULES_FILE
from gpufleet.deploy.routing import ROUTING
from gpufleet.devtools.paths import FIXTURES
from gpufleet.devtools.programs import binary

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
VARIANTS = ("", "podmonitor", "dcgm-exporter")
# The oldest Kubernetes release still supported upstream at the time of writing, and the newest the validator has.
KUBERNETES = ("1.34.0", kubernetes_validate.latest_version())
CRDS = FIXTURES / "prometheus-operator"


class _GoYaml(yaml.SafeLoader):
    """YAML as Go reads it: kubectl and the Operator's CRDs write a matcher's `=` bare, which YAML 1.1 (PyYAML's)
    tags as its "value" key; Go's YAML, which the API server and the Operator use, reads the string it is."""


_GoYaml.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or "kubectl"
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.load_all(result.stdout, Loader=_GoYaml) if o]


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the CRD's OpenAPI schema, for each pinned Prometheus Operator CRD."""
    schemas = {}
    for path in CRDS.glob("*.yaml.gz"):
        crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=_GoYaml)
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def unknown_fields(value: object, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare: the API server would prune them from a custom resource without a word,
    so a misspelt or misplaced field would be lost silently."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = [f"{path}.{key}" for key in value if key not in schema["properties"]]
        return found + [f for key, item in value.items() if key in schema["properties"]
                        for f in unknown_fields(item, schema["properties"][key], f"{path}.{key}")]
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [f for key, item in value.items()
                for f in unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")]
    if isinstance(value, list) and "items" in schema:
        return [f for index, item in enumerate(value)
                for f in unknown_fields(item, schema["items"], f"{path}[{index}]")]
    return []


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v or "base")
def test_every_object_validates_against_the_kubernetes_and_operator_schemas(variant):
    objects = kustomize(DEPLOY / variant)
    schemas = crd_schemas()
    kinds = set()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        kinds.add(obj["kind"])
        if key in schemas:
            # OpenAPI v3's schema language is JSON Schema draft 4's, less some keywords; its patterns are Go's, so
            # the schema itself is not checked as a Python one (a Go `(?i)` mid-pattern is no Python regex).
            jsonschema.Draft4Validator(schemas[key]).validate(obj)
            assert unknown_fields(obj["spec"], schemas[key]["properties"]["spec"], "spec") == [], key
        else:
            for version in KUBERNETES:
                kubernetes_validate.validate(obj, version, strict=True)
    assert {"Namespace", "ServiceAccount", "DaemonSet", "Service", "PrometheusRule", "AlertmanagerConfig",
            "ConfigMap"} <= kinds
    assert ("PodMonitor" in kinds) == (variant == "podmonitor") and ("ServiceMonitor" in kinds) != (
        variant == "podmonitor")


def test_a_misplaced_field_is_caught():
    """The strict check above is not vacuous: a field the CRD does not declare is named."""
    schema = crd_schemas()["monitoring.coreos.com/v1", "ServiceMonitor"]["properties"]["spec"]
    monitor = next(o for o in kustomize(DEPLOY) if o["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["relabelling"] = []
    assert unknown_fields(monitor["spec"], schema, "spec") == ["spec.endpoints[0].relabelling"]


def _rules(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "PrometheusRule" and o["metadata"]["name"] == name)["spec"]


def test_the_prometheus_rules_are_the_rule_files_and_promtool_loads_them_as_the_operator_holds_them(tmp_path):
    """The groups the Operator holds are the committed rule files' groups, equal as data: the promtool unit tests
    that pass on those files (test_alerts) pass on these, and are not run twice."""
    objects = kustomize(DEPLOY / "dcgm-exporter")
    for name, committed in (("gpufleet", RULES_FILE), ("gpufleet-dcgm", DCGM_RULES_FILE)):
        groups = _rules(objects, name)["groups"]
        assert groups == yaml.safe_load(committed.read_text())["groups"]
        (tmp_path / committed.name).write_text(yaml.safe_dump({"groups": groups}))
    checked = subprocess.run([binary("promtool"), "check", "rules", *map(str, tmp_path.glob("*.yml"))],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _matchers(matchers: list[dict[str, str]]) -> list[str]:
    return [f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"' for m in matchers]


def _as_alertmanager(route: dict[str, Any]) -> dict[str, Any]:
    """An AlertmanagerConfig route in Alertmanager's own terms."""
    names = {"groupBy": "group_by", "groupWait": "group_wait", "groupInterval": "group_interval",
             "repeatInterval": "repeat_interval"}
    result = {names.get(key, key): value for key, value in route.items() if key not in ("matchers", "routes")}
    if "matchers" in route:
        result["matchers"] = _matchers(route["matchers"])
    if "routes" in route:
        result["routes"] = [_as_alertmanager(child) for child in route["routes"]]
    return result


def test_the_alertmanager_config_routes_and_inhibits_as_compose_does():
    [config] = [o for o in kustomize(DEPLOY) if o["kind"] == "AlertmanagerConfig"]
    spec, compose = config["spec"], yaml.safe_load(ROUTING.read_text())
    # With the Operator's namespace matcher off, the top route takes gpufleet's alerts only, by name.
    [names, *rest] = spec["route"]["matchers"]
    alerts = {r["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert names["name"] == "alertname" and names["matchType"] == "=~" and set(names["value"].split("|")) == alerts
    assert _as_alertmanager({**spec["route"], "matchers": rest} if rest else
                            {k: v for k, v in spec["route"].items() if k != "matchers"}) == compose["route"]
    assert [{"source_matchers": _matchers(rule["sourceMatch"]), "target_matchers": _matchers(rule["targetMatch"]),
             "equal": rule["equal"]} for rule in spec["inhibitRules"]] == compose["inhibit_rules"]
    receivers = {r["name"]: r for r in spec["receivers"]}
    assert set(receivers) == {r["name"] for r in compose["receivers"]}
    assert receivers["pager"]["pagerdutyConfigs"] == [
        {"routingKey": {"name": "gpufleet-pagerduty", "key": "routing-key"}, "sendResolved": True}]
    assert receivers["ticket"]["webhookConfigs"][0]["sendResolved"] is True
    assert receivers["heartbeat"] == {"name": "heartbeat"}, "no heartbeat service until the site names one"


def test_the_monitor_keeps_the_exporters_job_labels_and_names_nodes_and_clusters():
    [monitor] = [o for o in kustomize(DEPLOY) if o["kind"] == "ServiceMonitor"]
    relabel = monitor["spec"]["endpoints"][0]["relabelings"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert relabel[0] == {"action": "labeldrop", "regex": "namespace|pod|container|service|endpoint"}
    assert {"targetLabel": "job", "replacement": "gpufleet"} in relabel
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} in relabel
    assert {"sourceLabels": ["__meta_kubernetes_node_label_gpufleet_io_leaf"], "targetLabel": "leaf"} in relabel
    assert monitor["spec"]["attachMetadata"] == {"node": True}


def test_without_the_kernel_log_the_kernel_collector_is_off_rather_than_blind():
    """A site that does not give the pod /dev/kmsg chose so: its nodes are not nodes that cannot read the log."""
    [daemonset] = [o for o in kustomize(DEPLOY) if o["kind"] == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert "--no-collector.kernel" in container["args"]
    assert not any(mount["name"] == "kmsg" for mount in container["volumeMounts"])


SITE = {
    "cluster_label": "site",
    "exporter_job": "gpu-nodes",
    "kubernetes": {
        "namespace": "gpu-monitoring", "cluster": "h100-east", "image": "registry.example.com/ops/gpufleet:7",
        "monitor_labels": {"release": "prom-stack"}, "node_selector": {"node.example.com/pool": "h100"},
        "dashboard_labels": {"grafana-dashboards": "gpu"}, "kernel_log": True,
        "heartbeat_url": "https://hc-ping.example.com/0f1e",
    },
}
DEFAULTS = ("namespace: gpufleet", "kube-prometheus-stack", "gpu-cluster", "nvidia.com/gpu.present",
            "ghcr.io/gpufleet/gpufleet", "grafana_dashboard")


def deploy(tmp_path: Path, settings: object) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site.yml"
    site.write_text(yaml.safe_dump(settings) if not isinstance(settings, str) else settings)
    return subprocess.run([sys.executable, "-m", "gpufleet", "deploy", "kubernetes", f"--config={site}",
                           f"--output={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120)


def test_a_site_configuration_reaches_every_object(tmp_path):
    result = deploy(tmp_path, SITE)
    assert result.returncode == 0, result.stderr
    objects = kustomize(tmp_path / "out")
    text = yaml.safe_dump_all(objects)
    assert [d for d in DEFAULTS if d in text] == []
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "gpu-monitoring", obj["metadata"]
        if obj["kind"] in ("ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"):
            assert obj["metadata"]["labels"]["release"] == "prom-stack", obj["kind"]
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.example.com/pool": "h100"}
    [container] = pod["containers"]
    assert container["image"] == "registry.example.com/ops/gpufleet:7"
    # The kernel log mounted, for the kernel collector and the XIDs the GPU collector reads from it by default.
    assert {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True} in container["volumeMounts"]
    assert "--no-collector.gpu.xid-kmsg" not in container["args"] and container["securityContext"]["privileged"] is True
    assert "--no-collector.kernel" not in container["args"]
    [monitor] = [o for o in objects if o["kind"] == "ServiceMonitor"]
    relabel = monitor["spec"]["endpoints"][0]["relabelings"]
    assert {"targetLabel": "site", "replacement": "h100-east"} in relabel
    assert {"targetLabel": "job", "replacement": "gpu-nodes"} in relabel
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-monitoring"]}
    rules = next(o for o in objects if o["kind"] == "PrometheusRule")
    assert 'up{job="gpu-nodes"}' in yaml.safe_dump(rules) and "by (site, instance)" in yaml.safe_dump(rules)
    assert all(o["metadata"]["labels"].get("grafana-dashboards") == "gpu" for o in objects if o["kind"] == "ConfigMap")
    [config] = [o for o in objects if o["kind"] == "AlertmanagerConfig"]
    assert {r["name"]: r.get("webhookConfigs") for r in config["spec"]["receivers"]}["heartbeat"] == [
        {"url": "https://hc-ping.example.com/0f1e", "sendResolved": False}]


@pytest.mark.parametrize(("values", "key"), [
    ({"kubernetes": {"namespce": "x"}}, "unknown key 'namespce'"),
    ({"kubernetes": {"namespace": "GPU_Mon"}}, "namespace: 'GPU_Mon' is not a Kubernetes name"),
    ({"kubernetes": {"monitor_labels": ["release"]}}, "monitor_labels: must map text to text"),
    ({"kubernetes": {"tolerations": [{"key": "a", "effects": "NoSchedule"}]}}, "tolerations: must be a list"),
    ({"kubernetes": {"kernel_log": "yes"}}, "kernel_log: must be true or false"),
    ({"kubernetes": {"scrape_interval": "soon"}}, "scrape_interval:"),
    ({"kubernetes": "gpufleet"}, "kubernetes: must map settings to values"),
    ("kubernetes: [unclosed", "not valid YAML"),
])
def test_a_bad_site_value_is_one_line_naming_it_and_nothing_is_written(tmp_path, values, key):
    result = deploy(tmp_path, values)
    assert result.returncode == 2
    # argparse's usage, then one line that names the file and the key.
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpufleet deploy kubernetes: error:")]
    assert len(errors) == 1 and key in errors[0], result.stderr
    assert not (tmp_path / "out").exists()
