"""Nodes that should be alike and are not: tickets for the configuration a node drifted to, before it fails a job.

Mixed driver versions within a job are a classic cause of NCCL failures and hangs, a VBIOS or HCA firmware
that differs from the rest of a model's fleet is a board someone missed in an update, a GPU with ECC off
can corrupt results silently, and a power limit below the board's default makes its node a straggler. None of
these is wrong at any one instant a person must act on; each is a ticket.

Versions are compared within a job (the nodes of one named job) and within a cluster's model (the GPU's name, or
the HCA's type for its firmware: a storage HCA of another model runs other firmware by design). MIG and
persistence mode are compared with the GPU's peers: the mode most GPUs of its model in its cluster have. The
group runs every five minutes: configuration changes when an operator changes it, and the alerts wait
`drift_for` so that a rolling update does not open a ticket for every node on its way.
"""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import GPU_KEY, NODE_JOBS
from gpufleet.alerts.rule import GPU, alert, printf, record

# Per node, one series per component, model and version it runs (labels `component`, `model`, `version`).
VERSIONS = "instance:gpufleet_component_version:info"
INTERVAL = "5m"
# component -> the info series that names its version, the label of the version and of the model it belongs to.
COMPONENTS = {
    "driver": ("gpufleet_gpu_info", "driver_version", "name"),
    "vbios": ("gpufleet_gpu_info", "vbios", "name"),
    "hca_firmware": ("gpufleet_infiniband_info", "firmware_version", "hca_type"),
}
# mode -> the series that says whether it is on.
MODES = {"mig": "gpufleet_gpu_mig_enabled", "persistence": "gpufleet_gpu_persistence_mode_enabled"}


def _versions(c: Config) -> list[dict[str, Any]]:
    rules = []
    for component, (metric, version, model) in COMPONENTS.items():
        known = c.metric(metric, version + '!=""')
        named = f"group by ({c.by('instance', model, version)}) ({known})"
        renamed = (f'label_replace(label_replace({named}, "model", "$1", "{model}", "(.*)"), '
                   f'"version", "$1", "{version}", "(.*)")')
        rules.append(record(VERSIONS, f"group by ({c.by('instance', 'model', 'version')}) ({renamed})",
                            component=component))
    return rules


def _version_list(c: Config, *labels: str) -> str:
    """A template that lists the versions of the alert's group with how many nodes run each."""
    matchers = ",".join(f"{label}=%q" for label in (c.cluster_label, *labels))
    query = printf(f"count by (version) ({VERSIONS}{{{matchers}}})",
                   *(f"$labels.{label}" for label in (c.cluster_label, *labels)))
    return (f'{{{{ with {query} | query | sortByLabel "version" }}}}{{{{ range $i, $s := . }}}}{{{{ if $i }}}}, '
            "{{ end }}{{ $s.Value }} on {{ $s.Labels.version }}{{ end }}{{ end }}")


def _mode_unlike_peers(c: Config, mode: str, metric: str) -> str:
    """GPUs whose `mode` differs from what most GPUs of their model in their cluster have."""
    gpu = c.by(*GPU_KEY)
    with_model = f"{c.metric(metric)} * on ({gpu}) group_left (name) {c.metric('gpufleet_gpu_info')}"
    most = f"avg by ({c.by('name')}) ({with_model}) > bool 0.5"
    return f'label_replace({with_model} != on ({c.by("name")}) group_left () ({most}), "mode", "{mode}", "", "")'


def drift(c: Config) -> dict[str, Any]:
    job = c.by("scheduler", "job_id")
    main_job = f'topk by ({c.by("instance")}) (1, {NODE_JOBS}{{job_id!=""}})'
    in_jobs = f"{VERSIONS} * on ({c.by('instance')}) group_left (scheduler, job_id) {main_job}"
    modes = " or ".join(_mode_unlike_peers(c, mode, metric) for mode, metric in MODES.items())
    power = (f"{c.metric('gpufleet_gpu_power_limit_watts')} < "
             f"{c.metric('gpufleet_gpu_power_limit_default_watts')} * {c.power_limit_share:g}")
    return {"name": "gpufleet-drift", "interval": c.d(INTERVAL), "rules": [
        *_versions(c),
        alert(c, "JobVersionsMixed",
              f"count by ({job}, component, model) (group by ({job}, component, model, version) ({in_jobs})) > 1",
              "warning", "The nodes of one job run different driver, VBIOS or HCA firmware versions.",
              "{{ $labels.scheduler }} job {{ $labels.job_id }} runs {{ $value }} versions of the "
              "{{ $labels.model }} {{ $labels.component }} across its nodes; mixed versions break or slow its "
              "collectives.", for_=c.drift_for, held=False),
        alert(c, "NodeVersionsMixed",
              f"count by ({c.by('component', 'model')}) (count by ({c.by('component', 'model', 'version')}) "
              f"({VERSIONS})) > 1",
              "warning", "Nodes of one model run different driver, VBIOS or HCA firmware versions.",
              "The {{ $labels.model }} nodes of " + f"{{{{ $labels.{c.cluster_label} }}}}" + " run "
              "{{ $value }} versions of the {{ $labels.component }}, by nodes: "
              f"{_version_list(c, 'component', 'model')}. Bring the odd ones in line.",
              for_=c.drift_for, held=False),
        alert(c, "GpuEccDisabled", f"{c.metric('gpufleet_gpu_ecc_enabled')} == 0", "warning",
              "A GPU runs with ECC off: a memory error corrupts its results silently.",
              f"{GPU} has ECC off{{{{ with {_pending(c)} | query }}}}; it is on again after the next reboot"
              "{{ end }}.", for_=c.drift_for),
        alert(c, "GpuModeUnlikePeers", modes, "warning",
              "A GPU's MIG or persistence mode differs from that of most GPUs of its model.",
              f"{GPU} has {{{{ $labels.mode }}}} mode {{{{ if eq $value 1.0 }}}}on{{{{ else }}}}off{{{{ end }}}}, "
              "unlike most {{ $labels.name }} GPUs of " + f"{{{{ $labels.{c.cluster_label} }}}}.", for_=c.drift_for),
        alert(c, "GpuPowerLimitBelowDefault", power, "warning",
              "A GPU's power limit was set below its board's default: its node runs slower than its peers.",
              f"{GPU} is held to {{{{ $value | humanize }}}}W, below its board's default; "
              "restore it with nvidia-smi -pl, or record why it is capped.", for_=c.drift_for),
    ]}


def _pending(c: Config) -> str:
    """A template query: whether the alert's GPU has ECC pending on (the next reboot turns it on)."""
    pending = c.metric("gpufleet_gpu_ecc_pending_enabled", f"{c.cluster_label}=%q", "instance=%q", "gpu=%q", "uuid=%q")
    return printf(f"{pending} == 1", f"$labels.{c.cluster_label}", "$labels.instance", "$labels.gpu", "$labels.uuid")
