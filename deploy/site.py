"""A site's values for the Kubernetes manifests: the `kubernetes:` section of the configuration file that also
shapes the rules and dashboards (alerts/config.py), so that one file describes a site. For example:

    cluster_label: cluster
    kubernetes:
      namespace: monitoring-gpu
      cluster: h100-east
      image: registry.example.com/gpufleet:0.1.0
      monitor_labels: {release: prom}
      node_selector: {node.kubernetes.io/instance-type: p5.48xlarge}

Each key is checked where the file is read; a wrong one stops the build with a line that names it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from gpufleet import __version__, duration

# DNS-1123 label: a namespace's or an object's name.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A label key: an optional DNS subdomain prefix and a name of at most 63 characters.
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


@dataclass(frozen=True)
class Site:
    namespace: str = "gpufleet"
    # The value of the cluster label (Config.cluster_label) on every series of this cluster.
    cluster: str = "gpu-cluster"
    image: str = f"ghcr.io/gpufleet/gpufleet:{__version__}"
    # On the ServiceMonitor, PodMonitor, PrometheusRule and AlertmanagerConfig: what kube-prometheus-stack's
    # Prometheus and Alertmanager select them by (its `release` label, the Helm release's name).
    monitor_labels: dict[str, str] = field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    # GPU nodes only: the label the GPU Operator's feature discovery sets.
    node_selector: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: list[dict[str, Any]] = field(default_factory=lambda: [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    # The GPU Operator's runtime class, which mounts the driver's libraries; empty where the node's default
    # runtime already does (a cluster without the GPU Operator, docs/deployment/kubernetes.md).
    runtime_class: str = "nvidia"
    exporter_args: list[str] = field(default_factory=list)  # More `gpufleet exporter` flags.
    # The kernel log, for the kernel collector's events and the GPU collector's XIDs from it (read by default):
    # opening /dev/kmsg in a container takes a privileged one, as the device is in no runtime's default allow list;
    # off, the exporter drops every capability, and its kernel collector says once that it cannot read the log.
    kernel_log: bool = False
    scrape_interval: str = "15s"
    # Prometheus label -> the Kubernetes node label it is taken from: a node's place in the fabric, for the
    # rules that see a leaf switch fail (alerts/topology.py's labels).
    topology_node_labels: dict[str, str] = field(default_factory=lambda: {
        "rack": "gpufleet.io/rack", "leaf": "gpufleet.io/leaf"})
    # Grafana's dashboard sidecar: the label it finds ConfigMaps by, and the annotation that names the folder.
    dashboard_labels: dict[str, str] = field(default_factory=lambda: {"grafana_dashboard": "1"})
    dashboard_folder_annotation: str = "grafana_folder"
    dashboard_folder: str = "gpufleet"
    # The Secret (in `namespace`) whose `routing-key` is the PagerDuty integration key of the pager receiver.
    pagerduty_secret: str = "gpufleet-pagerduty"
    ticket_url: str = "http://jiralert.gpufleet.svc:9097/alert"  # Where tickets go: jiralert or a like bridge.
    # Where the Watchdog goes each minute: a dead man's switch service's ping URL, which pages when it stops; empty,
    # it goes nowhere.
    heartbeat_url: str = ""


def check(values: object) -> None:
    """Raise ValueError naming the first key of a `kubernetes:` section that is unknown or malformed."""
    if not isinstance(values, dict):
        raise ValueError(f"must map settings to values, not {values!r}")
    fields = {f.name: f for f in dataclasses.fields(Site)}
    for key, value in values.items():
        if key not in fields:
            raise ValueError(f"unknown key {key!r}; the keys are {', '.join(sorted(fields))}")
        problem = _problem(key, value)
        if problem:
            raise ValueError(f"{key}: {problem}")


def site(values: dict[str, Any]) -> Site:
    """The defaults with a checked `kubernetes:` section's values."""
    check(values)
    return dataclasses.replace(Site(), **values)


def _problem(key: str, value: object) -> str:
    """What is wrong with one value, or ''."""
    default = getattr(Site(), key)
    if isinstance(default, bool):
        return "" if isinstance(value, bool) else f"must be true or false, not {value!r}"
    if isinstance(default, str):
        if not isinstance(value, str):
            return f"must be text, not {value!r}"
        return _text_problem(key, value)
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return f"must map text to text, not {value!r}"
        return _labels_problem(key, value)
    if key == "exporter_args":
        if not isinstance(value, list) or not all(isinstance(a, str) and a.startswith("--") for a in value):
            return f"must be a list of flags such as --collector.gpu.interval=5s, not {value!r}"
        return ""
    if not isinstance(value, list) or not all(isinstance(t, dict) and set(t) <= _TOLERATION_KEYS for t in value):
        return f"must be a list of tolerations (keys {', '.join(sorted(_TOLERATION_KEYS))}), not {value!r}"
    return ""


def _text_problem(key: str, value: str) -> str:
    if key in ("namespace", "pagerduty_secret") and not _NAME.fullmatch(value):
        return f"{value!r} is not a Kubernetes name (lower-case letters, digits and '-', at most 63)"
    if key == "runtime_class" and value and not _NAME.fullmatch(value):
        return f"{value!r} is not a runtime class name"
    if key in ("cluster", "dashboard_folder") and not (value and _LABEL_VALUE.fullmatch(value)):
        return f"{value!r} is not a label value (letters, digits, '-', '_' and '.', at most 63)"
    if key == "dashboard_folder_annotation" and not _LABEL_KEY.fullmatch(value):
        return f"{value!r} is not an annotation key"
    if key == "image" and (not value or any(c.isspace() for c in value)):
        return f"{value!r} is not an image reference"
    if key == "scrape_interval":
        try:
            duration.parse(value)
        except duration.DurationError as err:
            return str(err)
    url = key == "ticket_url" or (key == "heartbeat_url" and value)  # No heartbeat service is a choice.
    if url and not value.startswith(("http://", "https://")):
        return f"{value!r} is not an http(s) URL"
    return ""


def _labels_problem(key: str, value: dict[str, str]) -> str:
    """Label keys and values as Kubernetes takes them; for `topology_node_labels`, Prometheus label names to
    Kubernetes label keys."""
    names, texts = ((_PROMETHEUS_LABEL, "a Prometheus label name"), (_LABEL_KEY, "a Kubernetes label key")) \
        if key == "topology_node_labels" else ((_LABEL_KEY, "a Kubernetes label key"),
                                               (_LABEL_VALUE, "a Kubernetes label value"))
    for name, text in value.items():
        for checked, (pattern, what) in ((name, names), (text, texts)):
            if not pattern.fullmatch(checked):
                return f"{checked!r} is not {what}"
    return ""
