"""A job that hangs: its GPUs spin and none of them works, so it makes no progress while it holds every node.

A collective that never completes (a peer that died, a link that went down, a deadlock) leaves each of the
job's ranks in NCCL's wait: the kernel that polls for the peer keeps NVML's utilisation near 100 % while only a
few SMs run and the tensor pipes stand still. Nothing else sees it: the GPUs are healthy, busy and cool, and
the scheduler keeps the allocation until the job's time limit, often days away.

The judgment stands on GPM's SM and tensor activity, so only GPUs that have GPM (Hopper and later) take part;
a job's GPUs without it are left out, never counted as hung. Each GPU is, over the last half minute, `working`
(its SMs or tensor pipes active), `spinning` (busy to NVML while neither is) or `idle` (neither): a job hangs
while none of its GPUs works and most spin. Idle GPUs alone are not a hang (a checkpoint being written, an
allocation waiting for its user); a working GPU is a job that still moves, or one rank that the others wait for,
which the straggler alert judges.

The page names the job's nodes and the first of them to show a fault (an XID, a link that went down, an NVLink
down) in the minutes before, which is where the on-call engineer starts. While one of its nodes has a page of
its own open, the job's hang stands aside: that page is the incident. A job that has paged already keeps its
page through a later page of one of its nodes.
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.fabric import LINK_DOWNS
from gpufleet.alerts.recording import GPU_KEY, NODE_JOBS, STAKE_WINDOW
from gpufleet.alerts.rule import TREND_INTERVAL, alert, printf, record
from gpufleet.alerts.stake import job_gpus

# Per job and node: how many of the job's GPUs with GPM were working, spinning or idle (label `activity`).
ACTIVITY = "job_instance:gpufleet_gpu_activity:count"
_ACTIVITIES = ("working", "idle", "spinning")  # count_values' 0, 1 and 2 (see `_activity`).
_JOB = ("scheduler", "job_id")
_SHOWN_NODES = 8  # A page lists this many of a job's nodes, then their number.
# What each GPU did is judged over the whole interval between two of the group's evaluations, so that every
# moment of a hang is judged once: the alert goes pending at the first evaluation a whole window into the hang and
# fires `job_hang_for` later, the hang then held for that window and `for` together without a gap.
ACTIVITY_WINDOW = TREND_INTERVAL


def _activity(c: Config) -> dict[str, Any]:
    """ACTIVITY, from one pass over each GPU's ACTIVITY_WINDOW: 0 working, 1 idle, 2 spinning, counted per value.

    `max by` the GPU: a GPU in MIG mode reports GPM per instance, and any active instance is a GPU at work."""
    window = c.d(ACTIVITY_WINDOW)
    gpu = c.by(*GPU_KEY)

    def mean(metric: str) -> str:
        return f"max by ({gpu}) (avg_over_time({c.metric(metric)}[{window}]))"

    quiet = (f"({mean('gpufleet_gpu_sm_active_ratio')} < bool {c.job_hang_sm_active:g}) * on ({gpu}) "
             f"({mean('gpufleet_gpu_tensor_active_ratio')} < bool {c.job_hang_tensor_active:g})")
    busy = f"({mean('gpufleet_gpu_utilization_ratio')} > bool {c.busy_utilization:g})"
    named = c.metric("gpufleet_gpu_job_info", 'job_id!=""')
    jobs = f"last_over_time({named}[{c.d(TREND_INTERVAL)}])"  # As `node_signals` reads them: a missed scrape spared.
    state = f"{jobs} * on ({gpu}) group_left () ({quiet} * on ({gpu}) (1 + {busy}))"
    counted = f'count_values by ({c.by(*_JOB, "instance")}) ("activity", {state})'
    for value, name in enumerate(_ACTIVITIES):
        counted = f'label_replace({counted}, "activity", "{name}", "activity", "{value}")'
    return record(ACTIVITY, counted)


def _first_signal(c: Config) -> str:
    """A Go-template query for the job's node whose fault signal came first within `job_hang_lookback`: an XID
    (its own time), a link that went down or an NVLink down (when the rules first saw it), each begun within it."""
    lookback, step = c.d(c.job_hang_lookback), c.d(TREND_INTERVAL)
    since = f"time() - {duration.parse(lookback):g}"
    # Over the lookback, not at this instant: the node that failed may have stopped answering since, or its ranks
    # exited after the XID, and its series are gone by the time the page fires.
    xid = f"max_over_time({c.metric('gpufleet_gpu_xid_last_timestamp_seconds')}[{lookback}])"
    def began(selector: str, comparison: str, *labels: str) -> str:
        """When `selector` `comparison` was first seen within the lookback, unless it already held when the
        lookback began (a port down for an hour did not hang a job that ran until minutes ago)."""
        by = c.by("instance", *labels)
        return (f"(min by ({by}) (min_over_time(timestamp({selector}{comparison})[{lookback}:{step}])) "
                f"unless on ({by}) {selector} offset {lookback}{comparison})")

    signals = (f"max by ({c.by('instance', 'gpu', 'xid')}) ({xid}) > {since}", began(LINK_DOWNS, "", "device", "port"),
               began(c.metric("gpufleet_gpu_nvlink_up"), " == 0", "gpu", "link"))

    cluster = c.cluster_label
    job = f"max_over_time({NODE_JOBS}{{{cluster}=%q,scheduler=%q,job_id=%q}}[{lookback}])"
    query = f"bottomk(1, ({' or '.join(signals)}) and on ({c.by('instance')}) {job})"
    return printf(query, f"$labels.{cluster}", "$labels.scheduler", "$labels.job_id")


def _nodes(c: Config) -> str:
    cluster = c.cluster_label
    query = printf(f"group by ({c.by('instance')}) ({ACTIVITY}{{{cluster}=%q,scheduler=%q,job_id=%q}})",
                   f"$labels.{cluster}", "$labels.scheduler", "$labels.job_id")
    return (f'{{{{ with {query} | query | sortByLabel "instance" }}}}Its nodes: '
            f"{{{{ range $i, $s := . }}}}{{{{ if lt $i {_SHOWN_NODES} }}}}{{{{ if $i }}}}, {{{{ end }}}}"
            f"{{{{ $s.Labels.instance }}}}{{{{ end }}}}{{{{ end }}}}"
            f"{{{{ if gt (len .) {_SHOWN_NODES} }}}} and more, {{{{ len . }}}} in all{{{{ end }}}}. {{{{ end }}}}")


def jobs(c: Config) -> dict[str, Any]:
    job = c.by(*_JOB)
    activity = f"sum by ({job}) ({ACTIVITY})"
    spinning = f'sum by ({job}) ({ACTIVITY}{{activity="spinning"}})'
    working = f'{ACTIVITY}{{activity="working"}}'
    gpus = f'sum by ({job}) ({NODE_JOBS}{{job_id!=""}})'
    # A job with a node that has a page open stands aside: that page names the node to work on, and the hang is
    # likely its consequence. A silenced page counts too, since a silence does not stop the alert: someone owns
    # that node. The job pages once that page resolves with the job still hung.
    window = c.d(STAKE_WINDOW)
    # Standing aside is for a hang not yet paged. Once the job has paged, a page that opens later on one of its
    # nodes (a leaf switch lost under it) must not resolve the job's incident, only for it to open a second one
    # when that page ends.
    paged = (f'group by ({job}) (last_over_time({NODE_JOBS}{{job_id!=""}}[{window}]) and on ({c.by("instance")}) '
             'ALERTS{alertstate="firing",severity="critical"}) '
             f'unless on ({job}) ALERTS{{alertname="JobHung",alertstate="firing"}}')
    judged = duration.render(duration.parse(ACTIVITY_WINDOW) + duration.parse(c.job_hang_for))
    first = (f"{{{{ with {_first_signal(c)} | query }}}}{{{{ range $s := . }}}}The first fault signal on its "
             "nodes: {{ $s.Labels.instance }}, {{ if $s.Labels.xid }}XID {{ $s.Labels.xid }} on GPU "
             "{{ $s.Labels.gpu }}{{ else if $s.Labels.device }}{{ $s.Labels.device }} port {{ $s.Labels.port }} "
             "went down{{ else }}NVLink {{ $s.Labels.link }} of GPU {{ $s.Labels.gpu }} down{{ end }}, at "
             "{{ $s.Value | humanizeTimestamp }}.{{ end }}"
             "{{ else }}No node of the job showed an XID, a link down or an NVLink down before it.{{ end }}")
    return {"name": "gpufleet-jobs", "interval": c.d(TREND_INTERVAL), "rules": [
        job_gpus(c),
        _activity(c),
        alert(c, "JobHung",
              f"{spinning} / {activity} >= {c.job_hang_spinning_share:g} unless on ({job}) {working} "
              f"and on ({job}) {gpus} >= {c.job_hang_min_gpus} unless on ({job}) ({paged})",
              "critical", "A job's GPUs wait in a collective and none works: it makes no progress and holds its nodes.",
              f"{{{{ $value | humanizePercentage }}}} of the GPUs of {{{{ $labels.scheduler }}}} job "
              f"{{{{ $labels.job_id }}}} are busy to NVML while their SMs and tensor pipes stand still, and none "
              f"works, for {judged}: a collective waits for a peer that will not come. {_nodes(c)}{first}",
              for_=c.job_hang_for, held=False),
    ]}
