"""Each node's record of faults across jobs, repairs and weeks, and a ticket for the node that keeps failing.

A node that straggled in one job, or needed a GPU reset, usually does again: Meta's study of its research
clusters (HPCA '25) takes such "lemon" nodes out of service and inspects them before they fail the next job.
No single alert sees that: each episode ends with its own repair or its job. This group keeps the record.

Every `INTERVAL` it writes one series per node and kind of event that began in the interval that ended
`SETTLE` ago (a link flap: in the one before, once a leaf switch's outage would be known), and nothing
otherwise (the reliability group's tiling, `alerts/reliability.py`, and its reason to wait for samples to
land), so a month of a healthy fleet records nothing and the record is the count of what is there:

- `repair`: one of the node's GPUs was raised to a recovery action (a drain, reset, reboot or replacement that
  the exporter asks for after an XID, an ECC error, a lost GPU or an NVSwitch error), with none at the
  interval's start: one episode, however many of its GPUs the fault took;
- `straggler`: `NodeStraggler` began to fire for the node, on any signal;
- `link_flap`: one of its InfiniBand ports went down (its link-downed counter grew), none had in the interval
  before, and no leaf switch's outage explains it.

Each kind counts at most once a day for a node, and nothing counts while the node is in maintenance
(`alerts/maintenance.py`): planned work is not the node's fault.
`NodeRepeatedFaults` tickets a node whose record reaches `repeat_faults` within `repeat_fault_window`. The
record needs the store to keep that window (Prometheus keeps 15 days by default: set
`--storage.tsdb.retention.time` to 30d or more, or read a long-term store); with less, it counts what is kept.
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.fabric import LINK_DOWNS
from gpufleet.alerts.maintenance import MAINTENANCE
from gpufleet.alerts.reliability import INTERVAL, settled
from gpufleet.alerts.rule import TREND_INTERVAL, alert, printf, record

GROUP = "gpufleet-history"
# Per node and kind of event (label `event`, one of EVENT_KINDS): 1 in the interval where one began, absent
# otherwise.
EVENTS = "instance:gpufleet_node_faults:new10m"
EVENT_KINDS = ("repair", "straggler", "link_flap")
_DAYS = 30  # The record's days in its window: each kind counts at most once in each.


def _began(c: Config, now: str, then: str, late: bool = False) -> str:
    """Nodes where `now` (over the interval judged) holds and `then` (at its start) did not, seen at its start
    too, and not in maintenance during it. `late`: the interval judged is the one before, whose `now` and `then`
    the caller offsets by an interval more."""
    shift = 1 if late else 0
    node = c.by("instance")
    return (f"({now} unless on ({node}) {then}) and on ({node}) ({c.up()}{settled(c, shift + 1)} == 1) "
            f"unless on ({node}) max_over_time({MAINTENANCE}[{c.d(INTERVAL)}]{settled(c, shift)})")


def _events(c: Config) -> list[dict[str, Any]]:
    """Each kind's episodes, per node with its place (leaf, rack), which its sources carry from the scrape, as
    every alert about a node keeps it for Alertmanager's grouping."""
    w, node = c.d(INTERVAL), c.node()
    action = c.metric("gpufleet_gpu_recovery_action")
    repair = _began(c, f"max by ({node}) (max_over_time({action}[{w}]{settled(c, 0)})) > 0",
                    f"max by ({node}) ({action}{settled(c, 1)}) > 0")
    # Looked for at every evaluation of the straggler's group within the interval.
    firing = 'ALERTS{alertname="NodeStraggler",alertstate="firing"}'
    straggler = _began(c, f"max_over_time(group by ({node}) ({firing})[{w}:{c.d(TREND_INTERVAL)}]{settled(c, 0)})",
                       f"group by ({node}) ({firing}{settled(c, 1)})")
    # A leaf switch down takes every port behind it down: that is the switch's fault, not its nodes'. Its
    # FabricLeafDown, pending as soon as enough of its nodes' ports are down together, can come a scrape after
    # their link-downs, in the next interval: so the interval before is judged, against the leaf's alert over
    # both.
    both = c.d(duration.render(2 * duration.parse(INTERVAL)))
    leaf = (f' unless on ({c.by(c.leaf_label)}) max_over_time(ALERTS{{alertname="FabricLeafDown"}}[{both}]'
            f'{settled(c, 0)})' if c.leaf_label else "")
    flap = _began(c, f"group by ({node}) (max_over_time({LINK_DOWNS}[{w}]{settled(c, 1)}){leaf})",
                  f"group by ({node}) ({LINK_DOWNS}{settled(c, 2)})", late=True)
    # A daily record: a kind counts for a node at most once a day (a thirtieth of the window, which a site may
    # shorten), so that a straggler whose ticket flaps, or a port that flaps for hours, is one bad day and not a
    # lemon by itself; and an engine that restarts out of phase (vmalert starts its groups when it starts), whose
    # first window overlaps its last, does not count an episode of the overlap again.
    day = max(0.9 * duration.parse(w), duration.parse(c.d(c.repeat_fault_window)) / _DAYS)
    recent = duration.render(day)
    return [record(EVENTS, f"({expr} unless on ({node}) last_over_time({EVENTS}{{event=\"{event}\"}}[{recent}])) "
                           "* 0 + 1", event=event)
            for event, expr in zip(EVENT_KINDS, (repair, straggler, flap), strict=True)]


def history(c: Config) -> dict[str, Any]:
    window = c.d(c.repeat_fault_window)
    node, cluster = c.node(), c.cluster_label
    kinds = printf(f"sum by (event) (count_over_time({EVENTS}{{{cluster}=%q,instance=%q}}[{window}]))",
                   f"$labels.{cluster}", "$labels.instance")
    spoken = duration.spoken(c.repeat_fault_window)
    return {"name": GROUP, "interval": c.d(INTERVAL), "rules": [
        *_events(c),
        alert(c, "NodeRepeatedFaults",
              f"sum by ({node}) (count_over_time({EVENTS}[{window}])) >= {c.repeat_faults}",
              "warning", "A node keeps failing: take it out and inspect it before it fails another job.",
              f"{{{{ $labels.instance }}}} had {{{{ $value }}}} faults in the last {spoken} ("
              f'{{{{ range $i, $s := {kinds} | query | sortByLabel "event" }}}}{{{{ if $i }}}}, {{{{ end }}}}'
              "{{ $s.Labels.event }}: {{ $s.Value }}{{ end }}); "
              f"{c.repeat_faults} or more mark a node that fails job after job. Planned work is not counted.",
              held=False),
    ]}
