"""The first tier of the rules: per-GPU, per-port and per-node reductions, recorded once for everyone.

At 1,000 nodes a per-GPU metric is 8,000 series and a clock-event reason 72,000. This group reads
them once a minute (`TREND_INTERVAL`), with instant selectors or windows of at most 5 minutes, and
records what the trend alerts, the straggler maths and the dashboards then read: per-node
aggregates, link utilisation, and, for the checks that look back further, series that exist only
while something is wrong (a slowdown reason active, PCIe replays). Three sparse series are recorded
in the group of the alerts that read them instead: new ECC errors, a degraded PCIe link and the
node straggler signals (`ecc_new`, `pcie_degraded`, `node_signals`).
A window of 10 or 15 minutes over those sparse series costs nothing on a healthy fleet, where the
same window over the raw series would decode every GPU's samples at every evaluation. One window is
longer: the nodes expected (`NODES_SEEN`) read their own last hour, one series per node.
Names follow `level:metric:operations`.
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import TREND_INTERVAL, record

NODE_JOBS = "instance_job:gpufleet_gpu_job_info:count"
# What a fault puts at stake is the work of this window: the jobs a page names, and whether a node had any.
STAKE_WINDOW = "10m"
# Per node, its place kept: 1 while its GPUs had work in the last STAKE_WINDOW (a job's process, or a kernel that
# ran). Read by the pager group at every evaluation, so recorded once a minute here.
NODE_WORK = "instance:gpufleet_gpu_work:active10m"
GPUS_UP = "instance:gpufleet_gpus_up:sum"
# Sparse, per GPU: 1 while a slowdown reason holds the clocks (label `reason`); 1 while the PCIe link runs
# degraded (`pcie_degraded`, in the GPU trend group); the uncorrectable ECC errors counted in the last
# minute (`ecc_new`, in the GPU failures group), and the PCIe replays per second, while there are any.
SLOWDOWN = "instance_gpu:gpufleet_gpu_clock_slowdown:active"
PCIE_DEGRADED = "instance_gpu:gpufleet_gpu_pcie_link:degraded"
ECC_NEW = "instance_gpu:gpufleet_gpu_ecc_uncorrected_errors:increase1m"
PCIE_REPLAYS = "instance_gpu:gpufleet_gpu_pcie_replays:rate5m"
# Per node and job: a straggler signal, now (label `signal`: sm_clock, power or utilization; `peers`: job or
# model).
NODE_SIGNAL = "job_instance:gpufleet_straggler_signal:avg"
# Sparse, per GPU, with its model (`name`): busy over the last minute with no job id, as Kubernetes pods run.
BUSY_WITHOUT_JOB = "instance_gpu:gpufleet_gpu_busy_without_job:info"
# The rate window of the first tier's rates: what a link's utilisation and a port's waiting are averaged over.
RATE_WINDOW = "5m"
LINK_UTILIZATION = "instance_port:gpufleet_link_utilization:ratio_rate5m"
UTILIZATION = "instance:gpufleet_gpu_utilization_ratio:avg"
POWER = "instance:gpufleet_gpu_power_watts:sum"
# Per node: its InfiniBand ports counted by their busier direction's LINK_UTILIZATION, in buckets 5 % wide
# (label `bucket`: the lower bound, "0" to "0.95"; a link above its rate counts in the top one). What the fabric
# dashboard draws the fleet's ports from: at 1,000 nodes a row per port is 8,000 rows an hour long, a
# 2-second query for a picture nobody can read, where the buckets are at most 20 rows.
PORT_BUCKETS = "instance_bucket:gpufleet_infiniband_link_utilization:count"
PORT_BUCKET_COUNT = 20
SM_ACTIVE = "instance:gpufleet_gpu_sm_active_ratio:avg"
TENSOR_ACTIVE = "instance:gpufleet_gpu_tensor_active_ratio:avg"
XMIT_WAIT = "instance_port:gpufleet_infiniband_xmit_wait:rate5m"
# Per node: its most waiting port's XMIT_WAIT, for what needs the node and not the port (a straggler's cause).
NODE_XMIT_WAIT_MAX = "instance:gpufleet_infiniband_xmit_wait:max_rate5m"
JOB_XMIT_WAIT = "job_instance:gpufleet_infiniband_xmit_wait:rate5m"
JOB_XMIT_WAIT_MEDIAN = "job:gpufleet_infiniband_xmit_wait:median_rate5m"
# Per node, with its place (leaf, rack): the Unix time its exporter was last a scrape target (its `up` present,
# 0 or 1), carried from one evaluation to the next while it is not, until `node_forget_after`. The nodes the
# rules expect: those whose `up` vanished (a scrape shard lost, a target gone from discovery) are counted by
# NodesUnscraped and keep their held pages, for days if need be. It reads its own last value over LATCH_WINDOW,
# so a rule engine down for less than that picks it up again where it stood.
NODES_SEEN = "instance:gpufleet_up:last_seen"
LATCH_WINDOW = "1h"
# Sparse, per node: its `up` is still shown but no scrape wrote one within STALE_WINDOW, a scraper that died
# without a staleness marker (VictoriaMetrics keeps its series for the lookback). Longer than any scrape interval,
# and with the minute it is recorded at, well inside the default lookback.
NODES_STALE = "instance:gpufleet_up:stale"
STALE_WINDOW = "2m"
# Per node: the rate of its fastest InfiniBand port, which a port that trained down is compared with. Rates
# change only when a link retrains, so a minute-old figure serves the pager's 15 s group.
NODE_IB_RATE = "instance:gpufleet_infiniband_rate_bytes_per_second:max"


SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
# The labels that name one GPU (besides the cluster), which per-GPU joins match on.
GPU_KEY = ("instance", "gpu", "uuid")
# Per-GPU straggler signals, lower is slower: clock and power fall on a node whose clocks are capped;
# utilisation on one whose GPUs idle between steps (waiting on their host or a slow PCIe link) while its
# peers spin, busy, waiting for it (recorded and named as a cause; `stragglers` says why it is not alerted on).
_GPU_SIGNALS = {"sm_clock": ("gpufleet_gpu_clock_hertz", 'clock="sm"'), "power": ("gpufleet_gpu_power_watts",),
                "utilization": ("gpufleet_gpu_utilization_ratio",)}
_ENERGY = "gpufleet_gpu_energy_joules_total"


def share_of_time(c: Config, sparse: str, window: str) -> str:
    """The share of this group's evaluations over `window` at which a sparse series was present.

    Counting its samples against those of a series the group records for every node at every
    evaluation (`GPUS_UP`) makes the share independent of the evaluation interval. Taken per node: a node
    whose place labels changed (a new topology, a node moved) has two such series within the window.
    """
    return (f"count_over_time({sparse}[{c.d(window)}]) / on ({c.by('instance')}) group_left "
            f"max by ({c.by('instance')}) (count_over_time({GPUS_UP}[{c.d(window)}]))")


def node_signals(c: Config) -> list[dict[str, Any]]:
    """Each node's straggler signals now: the mean over its GPUs in each named job, and over its busy GPUs
    that have no job id (compared within their cluster and GPU model).

    The busy GPUs without a job id are found once, as a sparse series with their model, which the three
    signals then join: found per signal, they read every GPU's information, jobs and utilisation three
    times a minute, to keep nothing on a fleet whose jobs all have ids.
    """
    # Which GPUs have a job id: over the last minute, not at this instant, so that one missed scrape (which
    # marks a node's series stale) does not move a GPU with a job into the pool of GPUs without one.
    window = c.d(TREND_INTERVAL)
    named = c.metric("gpufleet_gpu_job_info", 'job_id!=""')
    jobs = f"last_over_time({named}[{window}])"
    info = f"last_over_time({c.metric('gpufleet_gpu_info')}[{window}])"
    gpu = c.by(*GPU_KEY)
    busy = f"avg_over_time({c.metric('gpufleet_gpu_utilization_ratio')}[{window}]) > {c.busy_utilization:g}"
    rules = [record(BUSY_WITHOUT_JOB, f"group by ({c.by(*GPU_KEY, 'name')}) "
                                      f"(({info} unless on ({gpu}) {jobs}) and on ({gpu}) {busy})")]
    for signal, (metric, *matchers) in _GPU_SIGNALS.items():
        # Every sample since the last evaluation, not the latest: a training step moves between phases of
        # very different power and utilisation, and each node is scraped at its own moment in the step, so
        # one sample a minute per node would make its windowed average depend on where its scrapes fall.
        value = f"avg_over_time({c.metric(metric, *matchers)}[{window}])"
        if signal == "power":
            # Every sample is still not enough for power, which differs most between a step's phases: where
            # a step lasts a whole number of scrape intervals, each node's scrapes fall at the same moments of
            # every step. A node of the end-to-end fleet sampled about once a step read 40 % of its limit for
            # a minute, then 92 %. The energy counter's rate counts every moment; the gauge stands in for a
            # GPU without one.
            value = f"(rate({c.metric(_ENERGY)}[{window}]) or {value})"
        # A node counts in its job only while the job runs there now. Held for the last minute, its job would
        # lend its id to the idle samples after the job's end: nodes scraped first after it then read a
        # scrape's worth of idle below their peers, and the signal window kept that for three evaluations,
        # a straggler at every job's end. A missed scrape costs the node this one evaluation, which the
        # signal window spares.
        rules.append(record(NODE_SIGNAL, f"avg by ({c.node('scheduler', 'job_id')}) "
                                         f"({named} * on ({gpu}) group_left () {value})", signal=signal, peers="job"))
        without_job = f"{value} * on ({gpu}) group_left (name) {BUSY_WITHOUT_JOB}"
        by_model = (f'label_replace(avg by ({c.node("name")}) ({without_job}), '
                    f'"model", "$1", "name", "(.*)")')
        rules.append(record(NODE_SIGNAL, f"max without (name) ({by_model})", signal=signal, peers="model"))
    return rules


def pcie_degraded(c: Config) -> dict[str, Any]:
    """The sparse degraded-PCIe series. It reads five per-GPU series, and a link's width and generation
    change only when it retrains, so it is recorded in the GPU trend group, with the alert that reads it."""
    gpu = c.by(*GPU_KEY)
    # An idle GPU lowers its PCIe generation to save power: only a busy GPU's lower generation counts.
    degraded = (f"({c.metric('gpufleet_gpu_pcie_link_width')} < {c.metric('gpufleet_gpu_pcie_link_max_width')})"
                f" or (({c.metric('gpufleet_gpu_pcie_link_generation')} < "
                f"{c.metric('gpufleet_gpu_pcie_link_max_generation')}) and on ({gpu}) "
                f"{c.metric('gpufleet_gpu_utilization_ratio')} > {c.busy_utilization:g})")
    return record(PCIE_DEGRADED, f"group by ({c.node('gpu', 'uuid')}) ({degraded})")


def ecc_new(c: Config) -> dict[str, Any]:
    """The sparse new-ECC-error series. Recorded in the pager's 15-second group, with the alert that reads
    it: its one-minute windows must overlap from one evaluation to the next, or an error that falls
    between two windows would be missed."""
    uncorrected = c.metric("gpufleet_gpu_ecc_errors_total", 'error="uncorrected"', 'scope="volatile"')
    return record(ECC_NEW, f"increase({uncorrected}[{c.d('1m')}]) > 0")


def _gpu_health(c: Config) -> list[dict[str, Any]]:
    active = c.metric("gpufleet_gpu_clock_event_active", f'reason=~"{"|".join(SLOWDOWN_REASONS)}"')
    return [
        record(SLOWDOWN, f"{active} == 1"),
        record(PCIE_REPLAYS, f"rate({c.metric('gpufleet_gpu_pcie_replays_total')}[{c.d(RATE_WINDOW)}]) > 0"),
    ]


def waits_more_than_peers(c: Config, matchers: str = "") -> str:
    """Nodes (per job) whose InfiniBand ports wait `xmit_wait_outlier` times more than their job's median
    node's: the congestion test where ticks differ by HCA, and the straggler test for a node's collectives."""
    return (f"{JOB_XMIT_WAIT}{matchers} / on ({c.by('scheduler', 'job_id')}) group_left {JOB_XMIT_WAIT_MEDIAN} > "
            f"{c.xmit_wait_outlier:g}")


def congested(c: Config, ports: str = XMIT_WAIT) -> str:
    """InfiniBand ports that wait for credits: above the absolute threshold, or above a tenth of it and on a
    node that waits more than its peers (`waits_more_than_peers`). Over NODE_XMIT_WAIT_MAX, the nodes with
    such a port: the same test, reading one series per node instead of every port twice."""
    return (f"{ports} > {c.xmit_wait_per_second:g} or ({ports} > {c.xmit_wait_per_second / 10:g}"
            f" and on ({c.by('instance')}) ({waits_more_than_peers(c)}))")


def _per_job(c: Config, node_level: str) -> str:
    """A per-node expression repeated for each job that has GPUs on the node, carrying the job's labels: once per
    node and job, however many of the job's pods (one per GPU, say) run there."""
    jobs = f"group by ({c.node('scheduler', 'job_id')}) ({NODE_JOBS})"
    return f"{jobs} * 0 + on ({c.by('instance')}) group_left {node_level}"


# Counter, link speed, the labels that name a port (besides the cluster), its class, and the direction.
_LINKS = (
    ("gpufleet_network_transmit_bytes_total", "gpufleet_network_speed_bytes_per_second", ("instance", "device"),
     "net", "transmit"),
    ("gpufleet_network_receive_bytes_total", "gpufleet_network_speed_bytes_per_second", ("instance", "device"),
     "net", "receive"),
    ("gpufleet_infiniband_port_xmit_data_bytes_total", "gpufleet_infiniband_rate_bytes_per_second",
     ("instance", "device", "port"), "infiniband", "transmit"),
    ("gpufleet_infiniband_port_rcv_data_bytes_total", "gpufleet_infiniband_rate_bytes_per_second",
     ("instance", "device", "port"), "infiniband", "receive"),
)


def link_ratios(c: Config, window: str, known_speed: bool = False,
                averaged: tuple[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
    """Throughput as a share of link speed, one expression per link class and direction, with the labels
    that say which. `known_speed` leaves out links that report a speed of 0, rather than calling them
    infinitely busy. `averaged` (a subquery's range and step) averages the rate over its points before it
    divides: the speed changes only when a link retrains, and a division at every point matches every port
    once per point, which cost more than the rates themselves."""
    ratios = []
    for counter, speed, port, class_, direction in _LINKS:
        divisor = f"({c.metric(speed)} > 0)" if known_speed else c.metric(speed)
        rate = f"rate({c.metric(counter)}[{c.d(window)}])"
        if averaged is not None:
            rate = f"avg_over_time({rate}[{averaged[0]}:{averaged[1]}])"
        ratio = f"{rate} / on ({c.by(*port)}) group_left () {divisor}"  # Many-to-one: the rate's labels, place too.
        ratios.append((ratio, {"direction": direction, "class": class_}))
    return ratios


def link_utilization(c: Config, name: str, window: str, known_speed: bool = False) -> list[dict[str, Any]]:
    return [record(name, ratio, **labels) for ratio, labels in link_ratios(c, window, known_speed)]


def port_buckets(c: Config) -> dict[str, Any]:
    """PORT_BUCKETS, from LINK_UTILIZATION, which the same group records just before it (Prometheus reads this
    evaluation's values, vmalert what its storage returns by then). A port that reports a rate of 0 (a link
    down) has no utilisation (+Inf or NaN) and is left out, not counted as saturated."""
    busiest = (f'max by ({c.by("instance", "device", "port")}) ({LINK_UTILIZATION}{{class="infiniband"}}) '
               f">= 0 < Inf")
    bucket = f"clamp_max(floor({PORT_BUCKET_COUNT} * ({busiest})), {PORT_BUCKET_COUNT - 1}) / {PORT_BUCKET_COUNT}"
    return record(PORT_BUCKETS, f'count_values by ({c.by("instance")}) ("bucket", {bucket})')


def nodes_seen(c: Config) -> dict[str, Any]:
    """NODES_SEEN: now for every node that is a scrape target, else its last value while younger than
    `node_forget_after`. Not `timestamp(up)`, which VictoriaMetrics gives at the query's step rather than the
    sample's. A node whose place changed keeps only its new series."""
    up = c.up()
    forget = duration.parse(c.d(c.node_forget_after))
    return record(NODES_SEEN, f"max by ({c.node()}) ({up} * 0 + time()) or "
                              f"(last_over_time({NODES_SEEN}[{c.d(LATCH_WINDOW)}]) unless on ({c.by('instance')}) "
                              f"{up}) > time() - {forget:g}")


def shared(c: Config) -> dict[str, Any]:
    rules = [
        record(NODE_JOBS, f"count by ({c.node('scheduler', 'job_id', 'namespace', 'pod')}) "
                          f"(last_over_time({c.metric('gpufleet_gpu_job_info')}[{c.d(TREND_INTERVAL)}]))"),
        record(UTILIZATION,
               f"avg by ({c.node()}) ({c.metric('gpufleet_gpu_utilization_ratio')})"),
        record(NODE_WORK, f"group by ({c.node()}) (max_over_time({UTILIZATION}[{c.d(STAKE_WINDOW)}]) > 0 or "
                          f"last_over_time({NODE_JOBS}[{c.d(STAKE_WINDOW)}]))"),
        # What the GPUs did, beside NVML's "a kernel ran" (GPM; only nodes whose boards have it).
        record(SM_ACTIVE, f"avg by ({c.node()}) ({c.metric('gpufleet_gpu_sm_active_ratio')})"),
        record(TENSOR_ACTIVE, f"avg by ({c.node()}) ({c.metric('gpufleet_gpu_tensor_active_ratio')})"),
        record(POWER,
               f"sum by ({c.node()}) ({c.metric('gpufleet_gpu_power_watts')})"),
        record(GPUS_UP, f"sum by ({c.node()}) ({c.metric('gpufleet_gpu_up')})"),
        record(XMIT_WAIT, f"rate({c.metric('gpufleet_infiniband_port_xmit_wait_total')}[{c.d(RATE_WINDOW)}])"),
        record(NODE_XMIT_WAIT_MAX, f"max by ({c.node()}) ({XMIT_WAIT})"),
        record(JOB_XMIT_WAIT, _per_job(c, f"sum by ({c.by('instance')}) ({XMIT_WAIT})")),
        record(JOB_XMIT_WAIT_MEDIAN, f"quantile by ({c.by('scheduler', 'job_id')}) (0.5, {JOB_XMIT_WAIT})"),
        *link_utilization(c, LINK_UTILIZATION, RATE_WINDOW),
        port_buckets(c),
        nodes_seen(c),
        record(NODES_STALE, f"group by ({c.node()}) ({c.up()} unless on ({c.by('instance')}) "
                            f"count_over_time({c.up()}[{c.d(STALE_WINDOW)}]))"),
        record(NODE_IB_RATE, f"max by ({c.node()}) ({c.metric('gpufleet_infiniband_rate_bytes_per_second')})"),
        *_gpu_health(c),
    ]
    return {"name": "gpufleet-recording", "interval": c.d(TREND_INTERVAL), "rules": rules}
