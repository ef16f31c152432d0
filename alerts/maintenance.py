"""Planned work: which nodes are in maintenance, as the scheduler says, so that the work pages nobody.

Maintenance is what a person declares: a Slurm maintenance reservation (Slurm flags its nodes MAINTENANCE), a
drain or down whose reason matches `Config.maintenance_reason`, or a Kubernetes cordon (kube-state-metrics'
`kube_node_spec_unschedulable`); or a silence made with `gpufleet maintenance`, which needs no rule. A drain by
`gpufleet remediate` or a health check is a fault's, not maintenance.

A node in maintenance fires `NodeMaintenance`, an info alert that reaches nobody and that Alertmanager's
inhibition rule turns into silence for every other alert of that node (kube-prometheus-stack's InfoInhibitor
does the same). The alerts keep their labels, so their fingerprints, and `gpufleet remediate`'s view of each
episode, stay as they are; once the node leaves maintenance whatever still fires is sent at the next
`group_interval`. Rules that count dark nodes or ports (RackDown, NodesUnscraped, FabricLeafDown) leave maintained
nodes out.

Slurm's view comes from `gpufleet remediate`'s /metrics (dry run or not), whose scrape must carry the cluster
label the exporters' targets carry; Kubernetes' from kube-state-metrics, matched by node name alone, as one
Prometheus per Kubernetes cluster runs.
"""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import NODE_WORK, NODES_SEEN, STAKE_WINDOW
from gpufleet.alerts.rule import TREND_INTERVAL, alert, held_while, record

# Per node in maintenance now: 1, with the node's place (leaf, rack) as its other series carry it.
MAINTENANCE = "instance:gpufleet_node_maintenance:info"


def scheduler_nodes(c: Config, series: str) -> str:
    """`series` (of gpufleet's nodes) with a `node` label: the scheduler's name of each, from its `instance`."""
    return f'label_replace({series}, "node", "$1", "instance", "{c.scheduler_node_pattern}")'


def _slurm(c: Config, states: str) -> str:
    """Slurm's nodes in any of `states` (a regex of the lower-case words `gpufleet remediate` serves)."""
    return f'gpufleet_slurm_node_state{{job="{c.remediate_job}",state=~"{states}"}}'


def _held_back(c: Config, slurm: str) -> str:
    """Each expected node (NODES_SEEN, so a node powered off for days stays matched) among Slurm's `slurm`, or that
    Kubernetes has cordoned."""
    nodes = scheduler_nodes(c, NODES_SEEN)
    return f"{nodes} and on ({c.by('node')}) ({slurm}) or {nodes} and on (node) kube_node_spec_unschedulable == 1"


def in_maintenance(c: Config) -> str:
    """Each expected node that Slurm or Kubernetes says is in maintenance, as `count` of 1."""
    reason = (f'gpufleet_slurm_node_reason_info{{job="{c.remediate_job}",reason=~"{_escaped(c.maintenance_reason)}"}}'
              f' and on ({c.by("node")}) {_slurm(c, "drain|down")}')
    slurm = f'{_slurm(c, "maintenance")} or {reason}'
    return f"count by ({c.node()}) ({_held_back(c, slurm)})"


def out_of_service(c: Config) -> str:
    """Each expected node that Slurm has drained, set down or put in maintenance, or that Kubernetes has cordoned:
    the scheduler places nothing new there, whoever took it out and why."""
    return f"group by ({c.by('instance')}) ({_held_back(c, _slurm(c, 'drain|down|maintenance'))})"


def _escaped(pattern: str) -> str:
    """A regex inside a PromQL double-quoted string, whose backslashes are escapes of their own."""
    return pattern.replace("\\", "\\\\").replace('"', '\\"')


def maintenance(c: Config) -> dict[str, Any]:
    """At the scrape interval: a node put into maintenance must be held back before its reboot's page."""
    rules = [
        record(MAINTENANCE, in_maintenance(c)),
        alert(c, "NodeMaintenance", MAINTENANCE, "info",
              "A node is in planned maintenance: its alerts reach nobody until it returns.",
              "{{ $labels.instance }} is in maintenance (a Slurm maintenance reservation, a drain or down whose "
              "reason the site counts as maintenance, or a Kubernetes cordon). Alertmanager holds back the node's "
              "other alerts meanwhile; what still fires once it returns to service is sent then.", held=False),
    ]
    return {"name": "gpufleet-maintenance", "rules": rules}


def _scheduler_lost(c: Config, nodes: str) -> str:
    """Each of `nodes` (a series per node) that Slurm marks down or not responding, or Kubernetes not Ready, and
    that is not in maintenance."""
    named = scheduler_nodes(c, nodes)
    slurm_down = f'{named} and on ({c.by("node")}) {_slurm(c, "down|not_responding")}'
    kube_down = f'{named} and on (node) kube_node_status_condition{{condition="Ready",status="true"}} == 0'
    return f"max by ({c.node()}) ({slurm_down} or {kube_down}) unless on ({c.by('instance')}) {MAINTENANCE}"


def maintenance_trends(c: Config) -> dict[str, Any]:
    """A node the scheduler lost (a ticket, and a page while its GPUs have work), and maintenance too wide to be
    routine (a ticket)."""
    lost = _scheduler_lost(c, f"{c.up()} == 1")
    share = f"count by ({c.cluster_label}) ({MAINTENANCE}) / count by ({c.cluster_label}) ({NODES_SEEN})"
    rules = [
        _scheduler_down_urgent(c, lost),
        alert(c, "NodeSchedulerDown", lost, "warning",
              "The scheduler cannot use a node whose exporter answers.",
              "Slurm marks {{ $labels.instance }} down or not responding (or Kubernetes not Ready) while gpufleet "
              "still scrapes it: no job is placed there, and nothing else says so. `scontrol show node` (or "
              "`kubectl describe node`) gives the reason: slurmd or the kubelet stopped, munge, a clock skew.",
              for_="10m", held=False),
        _maintenance_overdue(c),
        alert(c, "NodesInMaintenance", f"{share} > {c.maintenance_share:g}", "warning",
              "A large share of the fleet's nodes is in maintenance at once.",
              f"{{{{ $value | humanizePercentage }}}} of the nodes of {{{{ $labels.{c.cluster_label} }}}} are in "
              "maintenance, and none of their alerts reaches anyone. A rollout that large should be a decision; "
              "maintenance left on after its work is done hides the next fault.", for_="30m", held=False),
    ]
    return {"name": "gpufleet-maintenance-trends", "interval": c.d(TREND_INTERVAL), "rules": rules}


def _scheduler_down_urgent(c: Config, lost: str) -> dict[str, Any]:
    """The page for a node the scheduler lost while its GPUs had work: slurmd or the kubelet gone under a running job.

    Slurm sets such a node DOWN and fails its jobs once slurmd has been silent for `SlurmdTimeout` (5 minutes by
    default), and Kubernetes evicts its pods once it has been not Ready for their toleration (5 minutes by default):
    restarting the daemon before then keeps the job. So it pages after two minutes where NodeSchedulerDown, for an
    idle node, waits ten to ticket. Decided while the node still answers, then held for as long as the scheduler
    has the node down, whether or not its work goes on or its exporter answers: the job it paged for may be gone by
    then, but the node is what the page is about, and a page that ended with the job would be a page that resolved
    while its fault held."""
    node = c.by("instance")
    urgent = held_while(c, "NodeSchedulerDownUrgent", f"{lost} and on ({node}) {NODE_WORK}",
                        _scheduler_lost(c, NODES_SEEN))
    return alert(c, "NodeSchedulerDownUrgent", urgent, "critical",
                 "The scheduler lost a node whose GPUs have work.",
                 "Slurm marks {{ $labels.instance }} down or not responding (or Kubernetes not Ready) while its GPUs "
                 "had work in the last " + STAKE_WINDOW + ": its jobs fail when Slurm's SlurmdTimeout (or the pods' "
                 "not-ready toleration) runs out, unless slurmd (or the kubelet) answers again first.",
                 for_="2m", held=False, at_stake=True)


def _maintenance_overdue(c: Config) -> dict[str, Any]:
    """The ticket for a node whose maintenance outlived its stated end. Slurm ends a maintenance reservation at its
    end, but a node drained (or set down) for the work stays in maintenance after it; `gpufleet remediate` keeps the
    last end it saw for such a node. A drain or cordon alone states no end, and a silence ends by itself: what
    still fires then pages."""
    end = f'max by ({c.by("node")}) (gpufleet_slurm_node_maintenance_end_timestamp_seconds{{job="{c.remediate_job}"}})'
    past = f"{scheduler_nodes(c, MAINTENANCE)} * 0 + on ({c.by('node')}) group_left () (time() - {end})"
    return alert(c, "NodeMaintenanceOverdue", f"max by ({c.node()}) ({past}) > 0", "warning",
                 "A node is still in maintenance after its stated end.",
                 "{{ $labels.instance }} is still in maintenance {{ $value | humanizeDuration }} after the end of "
                 "the last maintenance reservation that held it, and none of its alerts reaches anyone meanwhile. "
                 "Finish the work and return it to service (`scontrol update nodename=<node> state=resume`), or "
                 "state a new end with a new reservation.", for_=c.maintenance_overdue, held=False)
