"""The exporter itself: a target that cannot be scraped and a share of a cluster's nodes that is no longer
scraped at all, at the scrape interval; a collector that fails or goes stale, every `TREND_INTERVAL`."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.gpu import driver_stake
from gpufleet.alerts.maintenance import MAINTENANCE
from gpufleet.alerts.recording import NODES_SEEN
from gpufleet.alerts.rule import TREND_INTERVAL, alert

# The share of a cluster's expected nodes (NODES_SEEN) that may vanish from the scrape at once before it pages:
# more than one node in twenty (and at least two), as a lost scrape shard, a partition or a broken service
# discovery would take; fewer is a node or two decommissioned.
UNSCRAPED_SHARE = 0.05


def exporter_health(c: Config) -> dict[str, Any]:
    """The pages for nodes gone dark, at the scrape interval: every other alert of such a node is blind."""
    up = c.up()
    node = c.by("instance")
    seen = NODES_SEEN
    # A node in maintenance may leave the scrape (powered off, its pod gone): planned, not a lost shard.
    unscraped = f"count by ({c.cluster_label}) ({seen} unless on ({c.by('instance')}) ({up} or {MAINTENANCE}))"
    rules = [
        alert(c, "NodeExporterDown", f"{up} == 0" + (f" unless on ({node}) {c.probe_failed()}" if c.probe_job else ""),
              "critical", "A gpufleet exporter cannot be scraped.",
              "Prometheus cannot scrape {{ $labels.instance }}: its GPUs, NICs and sensors are unobserved."
              + (_probe_says(c) if c.probe_job else ""), for_="5m", held=False, at_stake=True),
        *([alert(c, "NodeUnreachable", f"{up} == 0 and on ({node}) {c.probe_failed()}", "critical",
                 "A node answers neither its scrape nor its probe.",
                 "{{ $labels.instance }} answers neither Prometheus' scrape nor blackbox_exporter's probe: it is "
                 "down, hung or cut off from the network, and the work on it has stopped.",
                 for_="5m", held=False, at_stake=True)] if c.probe_job else []),
        # A scraper that dies leaves its targets with no `up` at all, not an `up` of 0: NodeExporterDown stays
        # quiet. The held alerts of those nodes stay (`rule.alert`); only the count of nodes that vanished says
        # why, for as long as they stay expected and unscraped.
        alert(c, "NodesUnscraped",
              f"{unscraped} / count by ({c.cluster_label}) ({seen}) > {UNSCRAPED_SHARE} "
              f"and on ({c.cluster_label}) {unscraped} >= 2", "critical",
              "A share of the fleet's nodes is no longer scraped.",
              f"{{{{ $value | humanizePercentage }}}} of the expected nodes of {{{{ $labels.{c.cluster_label} }}}} "
              "have no `up` at all: a scrape shard, its network or service discovery lost them. No new alert can "
              "fire for them; those that fired are held until they are seen again. Nodes retired on purpose are "
              f"forgotten after {c.node_forget_after}, or at once as the runbook says.",
              for_="5m", held=False),
    ]
    return {"name": "gpufleet-exporter", "rules": [*rules, _rack_down(c)]}


def _probe_says(c: Config) -> str:
    """What the node's probe says, where there is one: a node that answers it is up, its exporter failed."""
    probe = f'probe_success{{job="{c.probe_job}",{c.cluster_label}="%s",instance="%s"}}'
    return (f" {{{{ with printf `{probe}` $labels.{c.cluster_label} $labels.instance | query }}}}The node answers "
            "its probe: its exporter, or the network path to its port, failed.{{ else }}No probe of the node is "
            "recorded: it may be down as a whole.{{ end }}")


def _rack_down(c: Config) -> dict[str, Any]:
    """One alert for a rack whose nodes went dark together, where the site's topology gives each node a rack
    (`Config.rack_label`): its power or its top-of-rack switch, not the nodes. It fires before the nodes' own
    NodeExporterDown (`for` 1m against their 5m), which it holds back at Alertmanager. Dark is a scrape that
    fails (`up` 0): nodes with no `up` at all lost their scraper, which NodesUnscraped says once for the cluster,
    whatever racks they are in. A rack's InfiniBand links down together are FabricLeafDown's, by their leaf. Nodes
    in maintenance do not count: their reboots are planned, and a rack's planned power work is a silence of it."""
    rack = c.by(c.rack_label)
    on_rack = f'{c.rack_label}!=""'
    nodes_dark = f"count by ({rack}) ({c.up()} == 0 unless on ({c.by('instance')}) {MAINTENANCE})"
    nodes = f"count by ({rack}) ({NODES_SEEN}{{{on_rack}}})"
    return alert(c, "RackDown",
                 f"({nodes_dark} >= {c.rack_down_nodes}) and ({nodes_dark} / on ({rack}) group_left () {nodes} >= "
                 f"{c.rack_down_share:g})", "critical", "Most nodes of one rack went dark together.",
                 f"{{{{ $value }}}} nodes of {c.rack_label} {{{{ $labels.{c.rack_label} }}}} cannot be scraped at "
                 "once: the rack's power or its top-of-rack switch, not the nodes.", for_="1m", held=False)


def collector_health(c: Config) -> dict[str, Any]:
    """Tickets judged over 5 and 10 minutes: a fresher look finds nothing sooner that matters, and at 1,000
    nodes these two read 10,000 series (every collector's success, and its last success twice), which at
    the scrape interval was the larger part of the exporter group's time."""
    last_success = c.metric("gpufleet_collector_last_success_timestamp_seconds")
    # A GPU collector that fails for a lost GPU, or for a driver that does not answer on a node with work at
    # stake, is GpuLost's or GpuDriverUnresponsive's: standing aside here, not only at Alertmanager, keeps the
    # ticket from leaving in a moment the page is not there to inhibit it (a rule engine's restart). Read from the
    # pages' own series, not their ALERTS, which follow an evaluation of their group later (in vmalert, a remote
    # write later still). An idle node's hung driver, which does not page, tickets.
    node = c.by("instance")
    hung = (f'{c.metric("gpufleet_gpu_driver_up")} == 0 and on ({node}) ({driver_stake(c)} or '
            'ALERTS{alertname="GpuDriverUnresponsive"})')
    explained = (f'label_replace(max by ({node}) ({c.metric("gpufleet_gpu_up")} == 0) or max by ({node}) ({hung}), '
                 '"collector", "gpu", "", "")')
    unexplained = f"unless on ({c.by('instance', 'collector')}) {explained}"
    rules = [
        alert(c, "NodeCollectorFailing", f"{c.metric('gpufleet_collector_success')} == 0 {unexplained}", "warning",
              "An exporter collector keeps failing.",
              "The {{ $labels.collector }} collector of {{ $labels.instance }} has failed for 10 minutes; "
              "its log says why.", for_="10m"),
        # Aged at the scrape that reported it, not at evaluation: a node nobody scrapes any more keeps its last
        # sample for the lookback, and against time() every collector of it would look stale at once.
        alert(c, "NodeCollectorStale",
              f"timestamp({last_success}) - {last_success} > {max(1, round(c.stale_seconds / c.time_scale))} "
              f"{unexplained}",
              "warning", "An exporter collector has not succeeded recently.",
              "The {{ $labels.collector }} collector of {{ $labels.instance }} last succeeded "
              "{{ $value | humanizeDuration }} ago."),
        # NVML refused the XID event registration on every GPU (or the driver is gone): XIDs are lost until it
        # registers again, and the recovery actions they raise with them. A node with no GPU listed has none to
        # miss, and a driver gone pages through GpuLost.
        alert(c, "GpuXidEventsBlind",
              f"{c.metric('gpufleet_gpu_xid_events_registered')} == 0 "
              f"and on ({c.by('instance')}) {c.metric('gpufleet_gpu_devices')} > 0",
              "warning", "An exporter cannot register for its GPUs' XID events.",
              "NVML refuses the XID event registration on {{ $labels.instance }}: its XIDs, and the resets and "
              "reboots they call for, are not seen. The exporter's log says why.", for_="10m"),
        # A probe that fails while the node's exporter answers is the probe's fault (a firewall that drops ICMP, a
        # wrong module or address): were the exporter to stop as well, the page would say the node is down.
        *([alert(c, "NodeProbeFailing", f"{c.probe_failed()} and on ({node}) {c.up()} == 1", "warning",
                 "A node's probe fails while its exporter answers.",
                 "blackbox_exporter's probe of {{ $labels.instance }} has failed for 15 minutes while Prometheus "
                 "scrapes its exporter: the probe, not the node, is wrong. Until it is fixed, an exporter of this "
                 "node that stops pages as NodeUnreachable.", for_="15m", held=False)] if c.probe_job else []),
    ]
    return {"name": "gpufleet-exporter-trends", "interval": c.d(TREND_INTERVAL), "rules": rules}
