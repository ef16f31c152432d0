"""Straggler nodes: the node of a job that holds every other node back, found by two tests that must agree.

A robust z-score (median and median absolute deviation, so the straggler cannot hide by dragging
the mean) finds the outlier; a relative score against the job's median node keeps a tiny MAD from
firing on noise. Both stand on the median, which one slow node cannot move and the fastest healthy node
does not set. Each node's signal is the mean of each minute's scrapes, and the median of those minutes over
`signal_window`: a minute holds the compute and communication phases of a few training steps, and one slow
minute does not move the median. A minute in which one of the node's GPUs did no work for a whole scrape is a
pause, not a slow minute (a checkpoint written, a hang, a job that starts), and counts as the better of the
node's last two whole minutes of work (every scrape read), as does, in the median, a minute that missed a
scrape: a straggler's GPUs work through every scrape, only more slowly. Lower is worse for every signal.

Peers are the nodes of one job where the scheduler names jobs (Slurm, a job mapping file, a Kubernetes pod
named by a training operator). Nodes without a job id (no attribution, or pods named otherwise) are compared
within their cluster and GPU model, on their SM clock alone, and only while busy: an idle node holds nobody back.
This group first reduces each signal to one series per node and job (`recording.node_signals`), then
takes the median of those over `signal_window`, so its window spans a thousand series, not eight thousand. It
runs every minute (`TREND_INTERVAL`), its signals are medians of the minutes in 2-minute windows, and a node
must stay slow for 2 minutes (`straggler_for`) unless it was far below its job in every minute of the window:
what a straggler takes to be found is the minutes its slowdown needs to move the median past the thresholds,
those 2 minutes or the window's minutes, and up to one evaluation on top.
Network throughput is not a signal: in a synchronous job every node moves the same bytes per step,
so the straggler's throughput falls with everyone else's. What its port waits to send is: a node whose
InfiniBand ports wait `xmit_wait_outlier` times more than its job's median node holds the job's
collectives back while its GPUs look like everyone else's (signal `infiniband_xmit_wait`).
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.kernel import STALLS
from gpufleet.alerts.recording import (
    BUSY_WITHOUT_JOB,
    GPU_KEY,
    JOB_XMIT_WAIT,
    NODE_SIGNAL,
    NODE_XMIT_WAIT_MAX,
    PCIE_DEGRADED,
    PCIE_REPLAYS,
    SLOWDOWN,
    congested,
    node_signals,
    share_of_time,
    waits_more_than_peers,
)
from gpufleet.alerts.rule import TREND_INTERVAL, alert, printf, record
from gpufleet.alerts.stake import JOB_GPUS

PAUSED = "job_instance:gpufleet_gpu_paused:count1m"
WORKING = "job_instance:gpufleet_straggler_signal:avg_working"
WHOLE = "job_instance:gpufleet_straggler_signal:avg_working_scraped"
RECENT = "job_instance:gpufleet_straggler_signal:max_working2m"
STEADY = "job_instance:gpufleet_straggler_signal:avg_steady"
STEADY_WHOLE = "job_instance:gpufleet_straggler_signal:avg_steady_scraped"
SIGNAL = "job_instance:gpufleet_straggler_signal:median_over_time2m"
MEDIAN = "job:gpufleet_straggler_signal:median2m"
NODES = "job:gpufleet_straggler_signal:count"
MAD = "job:gpufleet_straggler_signal:mad2m"
RELATIVE = "job_instance:gpufleet_straggler_signal:relative2m"
ZSCORE = "job_instance:gpufleet_straggler_signal:zscore2m"
CAUSE = "instance:gpufleet_straggler_cause:active"
SLOW = "job_instance:gpufleet_straggler_score:slow"

# Besides the cluster: the labels that make a group of peers.
PEERS = ("scheduler", "job_id", "model", "signal")
# What names one node's series of a signal among its peers.
NODE_KEYS = (*PEERS, "peers", "instance")
_STALLS_WINDOW = "10m"
# How far back a paused node's minutes of work stand in for its pause: past it, the node leaves its job's
# comparison until it works again, and a job whose GPUs all wait is `JobHung`'s.
_CARRIED = "5m"


def _causes(c: Config) -> list[dict[str, Any]]:
    """Per node, what could explain a straggler: one series per cause, labelled with it."""
    def event(reasons: str) -> str:
        active = f'{SLOWDOWN}{{reason=~"{reasons}"}}'
        return f"max by ({c.by('instance')}) ({share_of_time(c, active, c.signal_window)}) > {c.slowdown_share:g}"

    pcie = (f"count by ({c.by('instance')}) ({PCIE_DEGRADED}) or max by ({c.by('instance')}) "
            f"({PCIE_REPLAYS} * 60) > {c.pcie_replays_per_minute:g}")
    nic = f"max by ({c.by('instance')}) ({congested(c, NODE_XMIT_WAIT_MAX)})"
    # Its GPUs ran nothing for part of each step while its peers' spun: they waited on their host (data
    # loading, the CPU, storage) or on a slow PCIe link, which is named beside it where one is degraded.
    idle = f'min by ({c.by("instance")}) ({RELATIVE}{{peers="job",signal="utilization"}}) < {c.straggler_relative:g}'
    # Its host's processes stalled for seconds at a time: CPUs locked up, tasks or storage not answering. They
    # are logged minutes apart, so they are looked for over `_STALLS_WINDOW`, not the signal's window.
    stalls = c.metric("gpufleet_kernel_events_total", f'event=~"{"|".join(STALLS)}"')
    kernel = f"max by ({c.by('instance')}) (increase({stalls}[{c.d(_STALLS_WINDOW)}])) > 0"
    causes = {
        "thermal slowdown": event("hw_thermal_slowdown|sw_thermal_slowdown"),
        "power brake": event("hw_power_brake_slowdown"),
        "PCIe degraded": pcie,
        "NIC congestion": nic,
        "GPUs idle between steps": idle,
        "host kernel stalls": kernel,
    }
    return [record(CAUSE, expr, cause=name) for name, expr in causes.items()]


def _paused(c: Config) -> list[dict[str, Any]]:
    """Each node's minutes of work in each job: a minute in which one of its GPUs in the job read less than
    `straggler_pause_utilization` at a scrape, idle through the whole interval the exporter averages, or did in
    the minute before (the scrape after a pause reads part of it), is the node pausing (one rank writing a
    checkpoint, a node that stalls, every rank writing at once), and the better of the node's last two whole
    minutes of work stands in for it. Counted as slow, a minute's write by the first node alone reads low in each
    minute whose scrapes it touches: three in a row when it falls across two minutes' edges, which the median
    keeps for three evaluations, all that `straggler_for` asks. Left out, the window's remaining minutes would be
    the partly idle ones at the write's edges; its last minute of work would often be the first of those. A
    pause is the job's, not the node's: on a node shared by two jobs, one job's checkpoint hides nothing of the
    other's (GPUs without a job id pause together, as they are compared together)."""
    gpu = c.by(*GPU_KEY)
    named = c.metric("gpufleet_gpu_job_info", 'job_id!=""')
    lookback = c.d(duration.render(2 * duration.parse(TREND_INTERVAL)))
    idle = (f"min_over_time({c.metric('gpufleet_gpu_utilization_ratio')}[{lookback}]) < "
            f"{c.straggler_pause_utilization:g}")
    job, keys = c.by("instance", "scheduler", "job_id"), c.by(*NODE_KEYS)
    interval = duration.parse(TREND_INTERVAL)
    two, three = (c.d(duration.render(n * interval)) for n in (1.5, 2.5))
    missed = f"min_over_time({c.up()}[{c.d(TREND_INTERVAL)}]) == 0"
    # Only while the node is in the job now: its minutes of work would otherwise outlive the job.
    stand_in = f"(last_over_time({RECENT}[{c.d(_CARRIED)}]) and on ({keys}) {NODE_SIGNAL})"
    return [
        record(PAUSED, f"count by ({job}) (({named} or {BUSY_WITHOUT_JOB}) and on ({gpu}) {idle})"),
        record(WORKING, f"{NODE_SIGNAL} unless on ({job}) {PAUSED}"),
        # A minute of work in which every scrape of the node was read: one that missed a scrape is the mean of
        # the samples left, which fall where they fall in a step and can read several percent low, and one that
        # missed the scrape before an evaluation has no value at all (the node's job is stale then).
        record(WHOLE, f"{WORKING} unless on ({c.by('instance')}) {missed}"),
        # The better of its last two whole minutes of work, kept through a pause: the minute a pause begins in
        # reads part of it without counting as one, and the minute before it stands in for both. Two, not more: a
        # straggler that was slow before the pause stays slow through it. Whole ones, reaching a minute further
        # back past one that is not: a pause counts its value once a minute, so one low minute carried through a
        # two-minute write reads as three, which the window's median and the deep test both take for a straggler.
        record(RECENT, f"(max_over_time({WHOLE}[{two}]) and on ({keys}) count_over_time({WHOLE}[{two}]) >= 2 "
                       f"or max_over_time({WHOLE}[{three}])) and on ({keys}) {WORKING}"),
        record(STEADY, f"{WORKING} or on ({keys}) {stand_in}"),
        # The same, with a minute of work that is not whole stood in for too, for the window's median: the mean
        # of the samples left, beside one low minute of the node's, made two of the window's three low. The deep
        # test keeps such a minute as it read, which no noise takes below `straggler_relative_deep`, so a
        # straggler that misses a scrape in its first slow minutes is found as soon as before.
        record(STEADY_WHOLE, f"{WHOLE} or on ({keys}) {stand_in}"),
    ]


def _confirmed(c: Config) -> str:
    """A slow node that has been slow for `straggler_for`, or one below `straggler_relative_deep` of its job's
    median node in every minute of the signal's window, which no noise and no stall does (a short stall
    touches two minutes, a longer one is a pause) and which needs no more confirmation. Only within a job, on
    the GPUs' own signals: nodes compared by model run different jobs, and the port's waits are a ratio.

    The alert has no `for`, which would hold back the deep node too: its evaluations are counted instead, over
    one more than `straggler_for` holds. vmalert reads a group's records an evaluation late (it writes them to
    the store, which it queries at once), and counts the evaluations before the one it cannot see yet where
    Prometheus counts up to its own: slow now and at all but one of the evaluations before, it fires an
    evaluation later, as a `for` would have. The deep test needs every minute of the window, so there it
    waits for the shallow one."""
    interval = duration.parse(TREND_INTERVAL)
    evaluations = round(duration.parse(c.straggler_for) / interval)
    if evaluations == 0:
        return SLOW
    minutes = round(duration.parse(c.signal_window) / interval) + 1
    keys = c.by(*NODE_KEYS)
    span = c.d(duration.render((minutes - 1) * interval + interval / 2))
    deep = (f'max_over_time({STEADY}{{peers="job",signal=~"sm_clock|utilization"}}[{span}]) '
            f"/ on ({c.by(*PEERS)}) group_left {MEDIAN} < {c.straggler_relative_deep:g} "
            f"and on ({keys}) count_over_time({STEADY}[{span}]) >= {minutes}")
    held = c.d(duration.render(evaluations * interval + 1.5 * interval))
    return f"{SLOW} and on ({keys}) (count_over_time({SLOW}[{held}]) > {evaluations} or {deep})"


def stragglers(c: Config) -> dict[str, Any]:
    peers = c.by(*PEERS)
    window = c.d(c.signal_window)
    full = max(1, round(duration.parse(c.signal_window) / duration.parse(TREND_INTERVAL)) - 1)
    settled = c.d(duration.render(duration.parse(c.signal_window) + duration.parse(TREND_INTERVAL)))
    before = c.d(duration.render(2 * duration.parse(TREND_INTERVAL)))
    recent = c.d(duration.render(1.5 * duration.parse(TREND_INTERVAL)))
    rules = [
        *node_signals(c),
        *_paused(c),
        # The median of the node's minutes over the window, not their mean: a node that stalls for part of a
        # minute (a garbage collection, a slow read) reads one or two low minutes, which the median leaves out,
        # where a mean carried one low minute through every evaluation of the window and the `for`. A straggler
        # is slow in every minute, and moves the median as far.
        # Only over a full window that leaves out the node's first evaluation in the job: that one averages
        # what its scrapes held before (a Prometheus that just started, a node that was idle before it
        # joined), a sample or two that are not yet the mean of several training steps. Each test spares one
        # missing evaluation, so a missed scrape does not drop a node from its job for a minute.
        # Only while the node is in its job, at this evaluation or the one before: once its job has left it, its
        # window holds its last minutes alone, the last often partly idle as the job tears down, and a node whose
        # scrape before the evaluation ahead of them failed read that minute alone for two evaluations after.
        record(SIGNAL, f"quantile_over_time(0.5, {STEADY_WHOLE}[{window}]) and "
                       f"count_over_time({STEADY_WHOLE}[{window}]) >= {full} and "
                       f"present_over_time({STEADY_WHOLE}[{recent}]) and "
                       f"present_over_time({STEADY_WHOLE}[{before}] offset {settled})"),
        record(MEDIAN, f"quantile by ({peers}) (0.5, {SIGNAL})"),
        record(NODES, f"count by ({peers}) ({SIGNAL})"),
        record(MAD, f"quantile by ({peers}) (0.5, abs({SIGNAL} - on ({peers}) group_left {MEDIAN})) >= "
                    f"{MEDIAN} * {c.straggler_mad_floor:g} or {MEDIAN} * {c.straggler_mad_floor:g}"),
        record(RELATIVE, f"{SIGNAL} / on ({peers}) group_left {MEDIAN}"),
        record(ZSCORE, f"0.6745 * ({SIGNAL} - on ({peers}) group_left {MEDIAN}) / on ({peers}) group_left {MAD}"),
        *_causes(c),
    ]
    cluster = c.cluster_label
    causes = (f'{{{{ with printf "{CAUSE}{{{cluster}=%q,instance=%q}}" $labels.{cluster} $labels.instance | query }}}}'
              '{{ range $i, $s := . | sortByLabel "cause" }}{{ if $i }}, {{ end }}{{ $s.Labels.cause }}{{ end }}'
              "{{ else }}none of thermal slowdown, power brake, PCIe, NIC congestion, idle GPUs or kernel stalls"
              "{{ end }}")
    # What the job loses: every other node waits for the straggler at each synchronous step, so the job moves at
    # about the straggler's pace (its score), and each of its GPUs loses the rest of each hour, one minus the score.
    # The NIC's signal is a ratio of waits, not a pace, so there only the job's GPUs are named.
    job_gpus = f"{JOB_GPUS}{{{cluster}=%q,scheduler=%q,job_id=%q}}"
    of_job = (f"$labels.{cluster}", "$labels.scheduler", "$labels.job_id")
    gpus = printf(job_gpus, *of_job)
    lost = printf(f"{job_gpus} * (1 - %g)", *of_job, "$value")
    cost = (f"{{{{ if $labels.job_id }}}}{{{{ with {gpus} | query }}}} Its job's {{{{ . | first | value }}}} GPUs "
            "wait for it at every step"
            '{{ if ne $labels.signal "infiniband_xmit_wait" }}'
            f"{{{{ with {lost} | query }}}}: at its pace the job loses about "
            '{{ . | first | value | printf "%.1f" }} GPU-hours an hour{{ end }}{{ end }}.{{ end }}{{ end }}')
    job = c.by("scheduler", "job_id")
    # Within a job the SM clock and utilisation are judged against the median node (`straggler_relative`): the
    # clock barely moves between a step's phases, and utilisation is the mean of the driver's samples over each
    # scrape interval, so healthy nodes differ by little more than their boards' own spread. Power (40 % to 92 %
    # of the limit within a step) wanders by several percent between healthy nodes' sampled means, and put
    # healthy nodes of the end-to-end test pending: it is recorded, drawn and named as a cause. Among nodes
    # compared by model, which run different jobs, only the SM clock is judged (at 0.75): it stays near its
    # maximum in every phase of any job's step, where power follows each job's own mix of phases, and put 7 of
    # 18 healthy Kubernetes nodes running three jobs pending.
    relative = (f'({RELATIVE}{{peers="job",signal=~"sm_clock|utilization"}} < {c.straggler_relative:g} or '
                f'{RELATIVE}{{peers="model",signal="sm_clock"}} < {c.straggler_relative_model:g})')
    named = '{job_id!=""}'
    waiting = (f"{waits_more_than_peers(c, named)} and {JOB_XMIT_WAIT} > {c.xmit_wait_per_second / 10:g} "
               f"and on ({job}) count by ({job}) ({JOB_XMIT_WAIT}{named}) >= {c.straggler_min_nodes}")
    rules.append(record(
        SLOW, f"{relative} and on ({peers}, instance) {ZSCORE} < {c.straggler_zscore:g}"
              f" and on ({peers}) {NODES} >= {c.straggler_min_nodes}"
              f' or label_replace(label_replace({waiting}, "signal", "infiniband_xmit_wait", "", ""),'
              f' "peers", "job", "", "")'))
    rules.append(alert(
        c, "NodeStraggler", _confirmed(c),
        "warning", "A node holds back the other nodes of its job.",
        "{{ $labels.instance }} straggles among {{ if $labels.job_id }}the nodes of {{ $labels.scheduler }} job "
        "{{ $labels.job_id }}{{ else }}the busy {{ $labels.model }} nodes{{ end }}: "
        '{{ if eq $labels.signal "infiniband_xmit_wait" }}its InfiniBand ports wait to send '
        "{{ $value | humanize }} times as long as the job's median node's"
        "{{ else }}its {{ $labels.signal }} is {{ $value | humanizePercentage }} of the median node's{{ end }}. "
        f"Likely cause: {causes}.{cost}"))
    return {"name": "gpufleet-stragglers", "interval": c.d(TREND_INTERVAL), "rules": rules}
