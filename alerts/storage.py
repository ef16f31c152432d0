"""A shared file system that stops: one page for the cluster, not a ticket per node.

An NFS server or a Lustre target that stops answering makes every node that mounts it log storage timeouts at once
(and hung tasks behind them). Each node's repeated timeouts would open their own ticket (NodeKernelEventsRepeated),
while the ranks blocked on I/O leave their GPUs idle rather than spinning, so that JobHung stays quiet: nobody would
be paged for the outage that stopped every job. Timeouts on a share of a cluster's nodes, and a few of them, within
a few minutes are that outage: it pages once, naming the servers the kernel named and the nodes, and the nodes'
storage and hung-task tickets are held back while it stands and for a window after. One node's timeouts stay its
own ticket: its mount, its network port."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import NODES_SEEN
from gpufleet.alerts.rule import TREND_INTERVAL, alert

OUTAGE = "NodesStorageTimeouts"
# The events of a node that a storage outage explains: its timeouts, and the tasks blocked behind them.
EXPLAINED = ("storage_timeout", "hung_task")


def timeouts(c: Config, window: str, *matchers: str) -> str:
    """Each node that logged a storage timeout within `window` (rounded: increase() extrapolates)."""
    events = c.metric("gpufleet_kernel_events_total", 'event="storage_timeout"', *matchers)
    return f"round(increase({events}[{window}])) >= 1"


def outage(c: Config) -> str:
    """Each cluster whose nodes with timeouts are both enough and a large enough share: their count."""
    hit = f"count by ({c.cluster_label}) ({timeouts(c, c.d(c.storage_outage_window))})"
    return (f"{hit} >= {c.storage_outage_nodes} and on ({c.cluster_label}) "
            f"{hit} / on ({c.cluster_label}) count by ({c.cluster_label}) ({NODES_SEEN}) >= {c.storage_outage_share:g}")


def held_back(c: Config, lookback: str) -> str:
    """The clusters whose storage outage stands, or stood (pending or firing) within `lookback`."""
    return (f"({outage(c)}) or on ({c.cluster_label}) max by ({c.cluster_label}) "
            f'(max_over_time(ALERTS{{alertname="{OUTAGE}"}}[{lookback}]))')


def storage(c: Config) -> dict[str, Any]:
    window = c.d(c.storage_outage_window)
    cluster = c.cluster_label
    mine = f'{cluster}="%[1]s"'  # The alert's cluster, in the queries of its description.
    servers = c.metric("gpufleet_kernel_storage_timeouts_total", mine)
    # A server's first timeout on a node is its series' first sample, which increase() would not count.
    before = f"{servers} offset {window}"
    named = f"count by (server) ({servers} - {before} > 0 or {servers} unless {before})"
    by_server = f"printf `{named}` $labels.{cluster} | query | sortByLabel `server`"
    by_node = f"printf `{timeouts(c, window, mine)}` $labels.{cluster} | query | sortByLabel `instance`"
    description = (
        f"{{{{ $value }}}} nodes of {{{{ $labels.{cluster} }}}} logged storage timeouts within "
        f"{c.storage_outage_window}{{{{ with {by_server} }}}}, naming "
        "{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s.Labels.server }} ({{ $s.Value }} nodes){{ end }}{{ end }}"
        ": a shared file system or its network, not the nodes. Their jobs wait on I/O with idle GPUs."
        f"{{{{ with {by_node} }}}} Nodes: "
        "{{ range $i, $n := . }}{{ if lt $i 10 }}{{ if $i }}, {{ end }}{{ $n.Labels.instance }}{{ end }}{{ end }}"
        "{{ if gt (len .) 10 }} and more{{ end }}.{{ end }}")
    return {"name": "gpufleet-storage", "interval": c.d(TREND_INTERVAL), "rules": [
        alert(c, OUTAGE, outage(c), "critical", "Many nodes lost their shared storage at once.",
              description, for_=c.storage_outage_for, held=False),
    ]}
