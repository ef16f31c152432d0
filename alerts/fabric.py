"""Network saturation and fabric faults: Ethernet and InfiniBand throughput, congestion, links and errors.

InfiniBand port states are those of the IBTA: `state` 4 is ACTIVE, `phys_state` 3 is Disabled (a
port switched off on purpose, which is not a fault).
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.maintenance import MAINTENANCE
from gpufleet.alerts.recording import (
    LINK_UTILIZATION,
    NODE_JOBS,
    NODES_SEEN,
    RATE_WINDOW,
    congested,
    link_ratios,
)
from gpufleet.alerts.rule import PORT, TREND_INTERVAL, alert, dark_nodes, printf, record

_LINK = ("{{ $labels.device }}{{ with $labels.port }} port {{ . }}{{ end }} of {{ $labels.instance }}")
# Sparse, per port, each recorded first in its group so that each pair of alerts reads one window once:
# the utilisation averaged over the saturation window while it is above the warning threshold (trends),
# and the link-downs in the link-downed window while there are any (fabric).
SATURATED = "instance_port:gpufleet_link_utilization:saturated"
LINK_DOWNS = "instance_port:gpufleet_infiniband_link_downed:increase"
# Sparse, per port: its state while it is not ACTIVE, for the alerts that need a port to be up. The page for a
# port that is down reads the state itself: read from this series, it fired 8 s later with vmalert in the
# end-to-end test (two runs of two), where a series recorded for the first time is not found at once.
NOT_ACTIVE = "instance_port:gpufleet_infiniband_state:not_active"
# Sparse, per port and counter: a narrow error counter at its maximum (exporter.collector.infiniband).
STOPPED = "gpufleet_infiniband_port_counter_saturated"
# The saturation window's utilisation is the 5-minute rate averaged over the window as if taken at every
# scrape. A rate over an exporter's snapshots wobbles by up to a collection interval over its window (±5 % at
# 15 s over 5 minutes), and the thresholds sit 2 points below a saturated link: the average of every
# scrape's rate evens the wobble out, where ten rates a minute apart did not (a link at 97 % did not page in
# the end-to-end test). Over evenly spaced points, the mean of the 5-minute rate over 10 minutes equals the
# mean of the 10-minute rate over 5 minutes (each is the counter's mean over the last 5 minutes less its
# mean 10 minutes earlier, over 10 minutes), so the subquery takes the second: twenty rates at this step
# instead of forty, and rate() still follows counter resets and series younger than the windows. The mean
# is divided by the port's speed now, once: a link that trained down is as busy as its traffic is against
# the speed it has. The rate is the first tier's (RATE_WINDOW).
SATURATION_STEP = "15s"


def _stopped(c: Config, *counters: str) -> str:
    """The ports one of whose narrow error `counters` sits at its maximum, by the node's labels and the port's:
    the counter counts nothing more, its rate reads 0, and an alert on it alone would go quiet on the ports that
    fail most. gpufleet's exporter says so beside node_exporter too."""
    return f"max by ({c.node('device', 'port')}) ({c.metric(STOPPED, _counters(counters))})"


def _counters(counters: tuple[str, ...]) -> str:
    return f'counter=~"{"|".join(counters)}"'


def _or_stopped(c: Config, expr: str, counters: tuple[str, ...], description: str) -> tuple[str, str]:
    """An alert's `expr` on narrow error `counters`, and its `description`, extended to a port whose counter
    stopped at its maximum: the alert fires, and says so."""
    matchers = f'{c.cluster_label}="%s",instance="%s",device="%s",port="%s",{_counters(counters)}'
    query = printf(c.metric(STOPPED, matchers), f"$labels.{c.cluster_label}", "$labels.instance", "$labels.device",
                   "$labels.port")
    stopped = (f"{{{{ with {query} | query }}}}{PORT}'s {{{{ range $i, $s := . }}}}{{{{ if $i }}}} and "
               "{{ end }}{{ $s.Labels.counter }}{{ end }} counter stopped at its maximum: it counts no more errors, "
               "so new ones cannot be seen. Check the link, then clear the port's counters (`perfquery -R`)."
               f"{{{{ else }}}}{description}{{{{ end }}}}")
    return f"max by ({c.node('device', 'port')}) ({expr}) or {_stopped(c, *counters)}", stopped


def _counted(c: Config, name: str, expr: str, counters: tuple[str, ...], summary: str, description: str,
             for_: str | None, held_by: tuple[str, ...]) -> dict[str, Any]:
    """A ticket on narrow error `counters`, which also fires, and says so, once one of them stopped."""
    expr, description = _or_stopped(c, expr, counters, description)
    return alert(c, name, expr, "warning", summary, description, for_=for_, held_by=held_by)


def _rate_above(c: Config, name: str, counter: str, per_second: float, summary: str, what: str,
                held_by: tuple[str, ...], narrow: str | None = None) -> dict[str, Any]:
    """An alert on a counter's rate; on a `narrow` error counter (its name in sysfs), also once it stopped."""
    expr = f"rate({c.metric(counter)}[{c.d('5m')}]) > {per_second:g}"
    description = f"{PORT} has {{{{ $value | humanize }}}} {what} per second."
    if narrow is not None:
        return _counted(c, name, expr, (narrow,), summary, description, "5m", held_by)
    return alert(c, name, expr, "warning", summary, description, for_="5m", held_by=held_by)


def _leaf_down(c: Config, down: str) -> dict[str, Any]:
    """One alert for a leaf switch whose nodes' links went down together, where the site's topology gives each
    node a leaf (`Config.leaf_label`): by leaf and HCA (in a rail-optimised fabric the HCA names the rail). It
    fires before the nodes' own port alerts (`for` 1m against their 2m), which it inhibits at Alertmanager,
    so the leaf is one incident rather than one per node."""
    leaf = c.by(c.leaf_label)
    on_leaf = f'{c.leaf_label}!=""'
    nodes_down = _nodes_down(c, down)
    job = f'job="{c.exporter_job}"'
    nodes = f"count by ({leaf}) ({c.metric('up', job, on_leaf)})"
    down = (f"({nodes_down} >= {c.leaf_down_nodes}) and "
            f"({nodes_down} / on ({leaf}) group_left () {nodes} >= {c.leaf_down_share:g})")
    return alert(c, "FabricLeafDown", f"max without () ({down}) or on ({leaf}, device) {_leaf_held(c)}",
                 "critical", "The InfiniBand links of the nodes behind one leaf switch went down together.",
                 f"{{{{ $value }}}} nodes behind {c.leaf_label} {{{{ $labels.{c.leaf_label} }}}} lost their "
                 "{{ $labels.device }} link at once, or cannot be seen since: the switch (or its rail), not the nodes.",
                 for_="1m", held=False)


def _nodes_down(c: Config, ports: str) -> str:
    """How many nodes behind each leaf have a port of each HCA among `ports`. A node in maintenance (recabled,
    rebooted) takes its links down on purpose: not the switch's doing."""
    leaf = c.by(c.leaf_label)
    return (f"count by ({leaf}, device) (max by ({leaf}, instance, device) ({ports}) "
            f"unless on ({c.by('instance')}) {MAINTENANCE})")


def _leaf_held(c: Config) -> str:
    """A firing FabricLeafDown kept firing while enough of its leaf's nodes are down or dark that it may still hold.

    A node whose scrape fails has no port state, so it no longer counts as down: a scrape shard lost, or a scraper
    too busy to answer for a moment, would resolve the leaf's page and lift its inhibition of the nodes' own port
    alerts, each of which would then page alone. Counted as down while dark, the leaf stays one incident until it
    can be seen to be back; one dark node behind a leaf that is back, fewer than the alert needs, does not hold it.
    The ports counted down here are every port not ACTIVE (NOT_ACTIVE, sparse), with the ports disabled on
    purpose or never cabled among them: leaving those out means reading every port's state once more at every
    evaluation, and they count only while some of the leaf's nodes are dark."""
    leaf = c.by(c.leaf_label)
    on_leaf = f'{c.leaf_label}!=""'
    node = c.by("instance")
    firing = f'max by ({leaf}, device) (ALERTS{{alertname="FabricLeafDown",alertstate="firing"}})'
    nodes_down = _nodes_down(c, f"{NOT_ACTIVE}{{{on_leaf}}}")
    dark = f"count by ({leaf}) ({dark_nodes(c, on_leaf)} unless on ({node}) {MAINTENANCE})"
    possible = f"(({nodes_down} or {firing} * 0) + on ({leaf}) group_left () {dark})"
    # As many as the alert needs: at least `leaf_down_nodes`, and `leaf_down_share` of the nodes expected there.
    needed = f"clamp_min(count by ({leaf}) ({NODES_SEEN}{{{on_leaf}}}) * {c.leaf_down_share:g}, {c.leaf_down_nodes})"
    return f"({possible} >= on ({leaf}) group_left () {needed}) and on ({leaf}, device) {firing}"


def fabric(c: Config) -> dict[str, Any]:
    """What pages for a port the moment it fails, evaluated at the scrape interval: a port down or trained
    down, and a link's downs over a window. Two sparse series, recorded first, read the link-downs' window
    once for two alerts and the ports' state once for two."""
    ib = "gpufleet_infiniband_"
    port = c.by("instance", "device", "port")
    # Rounded: increase() extrapolates to the window's edges, which can make 2 link-downs read 2.1.
    downed = f"round(increase({c.metric(ib + 'link_downed_total')}[{c.d(c.link_downed_window)}]))"
    not_active = f"{c.metric(ib + 'state_id')} != 4"
    paged = duration.render(duration.parse(c.link_downed_window) + duration.parse(c.link_downed_for))
    unexpected = f"({c.metric(ib + 'physical_state_id')} == 3 or {c.metric(ib + 'port_seen_active')} == 0)"
    # Beside node_exporter, a port's state outlives gpufleet's series when only gpufleet's exporter stops: a port
    # must then be known to have been ACTIVE, not merely not known to be uncabled.
    known = f" and on ({port}) {c.metric(ib + 'port_seen_active')} == 1" if c.node_exporter_job else ""
    # Once its link_downed counter stopped at 255, a port's flaps are no longer counted: the ticket says so, and
    # stays until the counter is cleared; a flapping port still down pages as down.
    # A leaf switch's page holds back its ports' link-downs for as long: a node whose own port page never fired
    # (its scrape failed once during the outage, and the pending `for` began again) would ticket for them after.
    leaf_paged = (f' unless on ({c.by(c.leaf_label)}, device) max_over_time(ALERTS{{alertname="FabricLeafDown",'
                  f'alertstate="firing"}}[{c.d(paged)}])' if c.leaf_label else "")
    downed_again, downed_again_description = _or_stopped(
        c, f"{LINK_DOWNS} <= {c.link_flaps} unless on ({port}) ({NOT_ACTIVE} or "
           f'max_over_time(ALERTS{{alertname=~"NicInfinibandPortDown|NicInfinibandLinkFlapping",'
           f'alertstate="firing"}}[{c.d(paged)}])){leaf_paged}', ("link_downed",),
        f"{PORT} went down {{{{ $value | humanize }}}} times in {c.link_downed_window}.")
    rules = [
        record(LINK_DOWNS, f"{downed} > 0"),
        record(NOT_ACTIVE, not_active),
        # Not a port disabled on purpose, nor one never seen ACTIVE (no cable): the exporter remembers which
        # have been, across restarts and reboots, so that a port that died is not taken for one never cabled.
        alert(c, "NicInfinibandPortDown", f"{not_active} unless on ({port}) {unexpected}{known}", "critical",
              "An InfiniBand port is not active.",
              f"{PORT} is in state {{{{ $value }}}}, not 4 (ACTIVE).", for_="2m", held_by=c.both_jobs(),
              inhibited_by=("FabricLeafDown", (c.leaf_label, "device")) if c.leaf_label else None),
        _leaf_down(c, f"{NOT_ACTIVE} unless on ({port}) {unexpected}{known}"),
        # Against the rate the port is known to reach (its own fastest, or its same-model peers'), as the
        # exporter reports it: never against another HCA, such as a slower storage HCA of the same node. A ticket,
        # as a PCIe link trained down is: the job runs on, slower (NodeStraggler says how much), and the cable
        # waits for the node's next drain.
        alert(c, "NicInfinibandRateDegraded",
              f"({c.metric(ib + 'rate_bytes_per_second')} < on ({port}) group_left () "
              f"{c.metric(ib + 'rate_capability_bytes_per_second')}) unless on ({port}) {NOT_ACTIVE}", "warning",
              "An InfiniBand port runs below the rate it is known to reach.",
              f"{PORT} runs at {{{{ $value | humanize }}}}B/s, below the rate it has run at or its same-model "
              "peers run at: the link trained down.", for_="5m", held_by=c.both_jobs()),
        # Only for a port that is back and was not paged for: a port still down is NicInfinibandPortDown's
        # page, and the link-downs a page already counted would reopen as a ticket once the page resolved.
        # It waits `link_downed_for`, so that a flap pages before its first link-down opens a ticket. A page
        # holds it back for the link-downs' window and that wait: over the window alone, the page's last firing
        # and the link-down it counted left their windows at about the same evaluation, and vmalert saw the
        # ticket's condition for a moment after a leaf switch's outage in the end-to-end test.
        alert(c, "NicInfinibandLinkDowned", downed_again, "warning", "An InfiniBand link went down and came back.",
              downed_again_description, for_=c.link_downed_for, held_by=c.node_jobs()),
        alert(c, "NicInfinibandLinkFlapping", f"{LINK_DOWNS} > {c.link_flaps}", "critical",
              "An InfiniBand link keeps going down.",
              f"{PORT} went down {{{{ $value | humanize }}}} times in {c.link_downed_window}.", held_by=c.node_jobs()),
    ]
    return {"name": "gpufleet-fabric", "rules": rules}


def fabric_trends(c: Config) -> dict[str, Any]:
    """Saturation and congestion over 5 to 10 minutes, and error rates and counts over 5 minutes to an hour:
    evaluated every `TREND_INTERVAL`."""
    ib = "gpufleet_infiniband_"
    node = c.by("instance")
    nodes = c.node_jobs()  # Whose series these alerts read: node_exporter's beside it.
    # The job with the most GPUs on the node names the training job a saturated port slows down.
    main_job = f"0 * topk by ({node}) (1, {NODE_JOBS})"
    rules = [
        *(record(SATURATED, f"{ratio} > {c.saturation_warning:g}", **labels)
          for ratio, labels in link_ratios(c, c.saturation_window, averaged=(c.d(RATE_WINDOW), c.d(SATURATION_STEP)))),
        # Not where NicSaturatedTrainingJob's condition already holds on the latest utilisation: the
        # 10-minute average of a port that jumps to 97% passes 80% a minute and a half before 95%, and the
        # ticket would leave Alertmanager before the page that inhibits it exists.
        # Only on a node scraped now: the 10-minute average outlives a node that stopped answering or that nothing
        # scrapes any more by far longer than the job its page needs, and would ticket it on its way out.
        alert(c, "NicSaturated",
              f"({SATURATED} unless on ({c.by('instance', 'device', 'port', 'direction')}) "
              f"({LINK_UTILIZATION} > {c.saturation_critical:g} and on ({node}) {NODE_JOBS})) "
              f"and on ({node}) {c.up(*nodes)} == 1", "warning",
              "A network link runs near its speed.",
              f"{_LINK} {{{{ $labels.direction }}}}s at {{{{ $value | humanizePercentage }}}} of its link speed "
              f"over {c.saturation_window}.", for_=c.saturation_for, held_by=nodes),
        alert(c, "NicSaturatedTrainingJob",
              f"({SATURATED} > {c.saturation_critical:g}) + on ({node}) "
              f"group_left (scheduler, job_id, namespace, pod) {main_job}", "warning",
              "A network link of a node running a training job is saturated.",
              f"{_LINK} {{{{ $labels.direction }}}}s at {{{{ $value | humanizePercentage }}}} of its link speed "
              f"over {c.saturation_window} while it runs a "
              "{{ $labels.scheduler }} job{{ with $labels.job_id }} ({{ . }}){{ end }}"
              "{{ with $labels.pod }} (pod {{ $labels.namespace }}/{{ . }}){{ end }}.", for_=c.saturation_for,
              held_by=nodes),
        alert(c, "NicInfinibandCongested", congested(c), "warning",
              "An InfiniBand port waits for credits: the fabric is congested.",
              f"{PORT} waited {{{{ $value | humanize }}}} ticks per second to send (port_xmit_wait).",
              for_="10m", held_by=nodes),
        _rate_above(c, "NicInfinibandReceiveErrors", ib + "port_rcv_errors_total", c.receive_errors_per_second,
                    "An InfiniBand port receives malformed packets.", "receive errors", nodes, "port_rcv_errors"),
        _rate_above(c, "NicInfinibandTransmitDiscards", ib + "port_xmit_discards_total",
                    c.transmit_discards_per_second, "An InfiniBand port discards packets it should send.",
                    "transmit discards", nodes, "port_xmit_discards"),
        _rate_above(c, "NicRoceOutOfBuffer", ib + "hw_out_of_buffer_total", c.roce_out_of_buffer_per_second,
                    "A RoCE port drops packets for want of receive buffers.", "out-of-buffer drops", ()),
        _rate_above(c, "NicRoceSlowRestart", ib + "hw_roce_slow_restart_total", c.roce_slow_restarts_per_second,
                    "RoCE queue pairs keep falling back to slow restart after packet loss.", "slow restarts", ()),
        alert(c, "NicEthernetErrors",
              f"sum by ({c.node('device')}) (rate({c.metric('gpufleet_network_receive_errors_total')}"
              f"[{c.d('5m')}]) + rate({c.metric('gpufleet_network_transmit_errors_total')}[{c.d('5m')}])) / "
              f"sum by ({c.node('device')}) (rate({c.metric('gpufleet_network_receive_packets_total')}"
              f"[{c.d('5m')}]) + rate({c.metric('gpufleet_network_transmit_packets_total')}[{c.d('5m')}])) > "
              f"{c.ethernet_error_share:g}", "warning", "An Ethernet interface has many packet errors.",
              "{{ $labels.device }} of {{ $labels.instance }} errs on {{ $value | humanizePercentage }} "
              "of its packets.", for_="15m", held_by=nodes),
        alert(c, "NicEthernetFlapping", f"changes({c.metric('gpufleet_network_up')}[{c.d('2m')}]) > 2", "warning",
              "An Ethernet interface keeps going up and down.",
              "{{ $labels.device }} of {{ $labels.instance }} changed state {{ $value }} times in 2 minutes.",
              for_="2m", held_by=nodes),
        _counted(c, "NicInfinibandSymbolErrors",
                 f"increase({c.metric(ib + 'symbol_error_total')}[{c.d('1h')}]) > {c.symbol_errors_per_hour}",
                 ("symbol_error",), "An InfiniBand port sees many symbol errors: a bad cable or transceiver.",
                 f"{PORT} had {{{{ $value | humanize }}}} symbol errors in the last hour.", None, nodes),
        _counted(c, "NicInfinibandLinkErrorRecovery",
                 f"rate({c.metric(ib + 'link_error_recovery_total')}[{c.d('5m')}]) * 60 > "
                 f"{c.link_error_recoveries_per_minute:g}", ("link_error_recovery",),
                 "An InfiniBand link keeps retraining.",
                 f"{PORT} recovered from link errors {{{{ $value | humanize }}}} times per minute.", "5m", nodes),
        _counted(c, "NicInfinibandLinkIntegrityErrors",
                 f"increase({c.metric(ib + 'local_link_integrity_errors_total')}[{c.d('15m')}]) > 0 or "
                 f"increase({c.metric(ib + 'excessive_buffer_overrun_errors_total')}[{c.d('15m')}]) > 0",
                 ("local_link_integrity_errors", "excessive_buffer_overrun_errors"),
                 "An InfiniBand link broke its integrity or overran its buffers.",
                 f"{PORT} counted link integrity or buffer overrun errors in the last 15m.", None, nodes),
    ]
    return {"name": "gpufleet-fabric-trends", "interval": c.d(TREND_INTERVAL), "rules": rules}
