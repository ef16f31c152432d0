"""Straggler nodes: the node of a job that holds every other node back, found by two tests that must agree.

A robust z-score (median and median absolute deviation, so the straggler cannot hide by dragging
the mean) finds the outlier; a relative score against the job's median node keeps a tiny MAD from
firing on noise. Both stand on the median, which one slow node cannot move and the fastest healthy node
does not set. Each node's signal is the mean of each minute's scrapes, and the best of those minutes over
`signal_window`: a minute holds the compute and communication phases of a few training steps, and a straggler
is slow in every one of them, where a node's stall shorter than about two minutes (one rank writing a
checkpoint) leaves a fast minute in each window, and a pause of the whole job lowers every node's minutes
alike, which the best minute passes over. Lower is worse for every signal.

Peers are the nodes of one job where the scheduler names jobs (Slurm, a job mapping file, a Kubernetes pod
named by a training operator). Nodes without a job id (no attribution, or pods named otherwise) are compared
within their cluster and GPU model, on their SM clock alone, and only while busy: an idle node holds nobody back.
This group first reduces each signal to one series per node and job (`recording.node_signals`), then
takes the best of those over `signal_window`, so its window spans a thousand series, not eight thousand. It
runs every minute (`TREND_INTERVAL`), its signals are the best minute of 2-minute windows and its
`for` is a minute: a straggler is found once four minutes in a row read slow (the window's three, then one
more for the `for`), with up to one evaluation on top.
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

SIGNAL = "job_instance:gpufleet_straggler_signal:max_over_time2m"
MEDIAN = "job:gpufleet_straggler_signal:median2m"
NODES = "job:gpufleet_straggler_signal:count"
MAD = "job:gpufleet_straggler_signal:mad2m"
RELATIVE = "job_instance:gpufleet_straggler_signal:relative2m"
ZSCORE = "job_instance:gpufleet_straggler_signal:zscore2m"
CAUSE = "instance:gpufleet_straggler_cause:active"

# Besides the cluster: the labels that make a group of peers.
PEERS = ("scheduler", "job_id", "model", "signal")
_STALLS_WINDOW = "10m"


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


def stragglers(c: Config) -> dict[str, Any]:
    peers = c.by(*PEERS)
    window = c.d(c.signal_window)
    full = max(1, round(duration.parse(c.signal_window) / duration.parse(TREND_INTERVAL)) - 1)
    settled = c.d(duration.render(duration.parse(c.signal_window) + duration.parse(TREND_INTERVAL)))
    before = c.d(duration.render(2 * duration.parse(TREND_INTERVAL)))
    rules = [
        *node_signals(c),
        # The best of the node's minutes over the window, not their mean or median: a node that stalls while its
        # peers wait (one rank writing a checkpoint, a garbage collection, a slow read) reads low in each minute
        # whose scrapes the stall touches, the scrape after its end included: three in a row for a minute's
        # write across two minutes' edges, which a median of three leaves in two evaluations and a mean in all.
        # A straggler is slow in every minute, and the best of three needs three; the `for` asks a fourth.
        # Only over a full window that leaves out the node's first evaluation in the job: that one averages
        # what its scrapes held before (a Prometheus that just started, a node that was idle before it
        # joined), a sample or two that are not yet the mean of several training steps. Each test spares one
        # missing evaluation, so a missed scrape does not drop a node from its job for a minute.
        record(SIGNAL, f"max_over_time({NODE_SIGNAL}[{window}]) and "
                       f"count_over_time({NODE_SIGNAL}[{window}]) >= {full} and "
                       f"present_over_time({NODE_SIGNAL}[{before}] offset {settled})"),
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
    rules.append(alert(
        c, "NodeStraggler",
        f"{relative} and on ({peers}, instance) {ZSCORE} < {c.straggler_zscore:g}"
        f" and on ({peers}) {NODES} >= {c.straggler_min_nodes}"
        f' or label_replace(label_replace({waiting}, "signal", "infiniband_xmit_wait", "", ""),'
        f' "peers", "job", "", "")',
        "warning", "A node holds back the other nodes of its job.",
        "{{ $labels.instance }} straggles among {{ if $labels.job_id }}the nodes of {{ $labels.scheduler }} job "
        "{{ $labels.job_id }}{{ else }}the busy {{ $labels.model }} nodes{{ end }}: "
        '{{ if eq $labels.signal "infiniband_xmit_wait" }}its InfiniBand ports wait to send '
        "{{ $value | humanize }} times as long as the job's median node's"
        "{{ else }}its {{ $labels.signal }} is {{ $value | humanizePercentage }} of the median node's{{ end }}. "
        f"Likely cause: {causes}.{cost}",
        for_=c.straggler_for))
    return {"name": "gpufleet-stragglers", "interval": c.d(TREND_INTERVAL), "rules": rules}
