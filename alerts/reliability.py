"""Recording rules for the reliability report: each interruption of a GPU, port or node, once, by cause.

An interruption is the start of a fault that stops a job on that hardware: an XID that needs a reset,
an application XID, a memory error, a GPU off the bus, an NVLink or InfiniBand port down, thermal
slowdown, or the node's exporter gone. Every `INTERVAL` these rules write one series per object and
class that had an interruption start in the interval just ended, and nothing otherwise, so a month of
a healthy fleet records nothing and the report counts by summing what is there.

How a start is recognised, so that each one is counted once: a class counts for an object where one of
its signals started in this interval and none in the one before, so that a burst of errors over several
intervals, or two signals of one fault that straddle an interval's end (an ECC count and its XID, seen
one collection apart), are one interruption. A signal starts with:

- a counter (XIDs, uncorrectable ECC errors, link downs) that grew. A sparse series born in the interval
  (an XID counter is created by its first event) counts as grown;
- a state (GPU lost, row remap failed, NVLink or port down, thermal slowdown, exporter down) seen bad
  at some sample of the interval and good at its start (a state whose series exists only while bad, an
  NVLink's, where it did not exist at the start);
- and, for everything on a node, only if the node was scraped at the interval's start: a node coming
  back after a gap shows counters and states that are not new.

The intervals tile the time (`x - x offset INTERVAL`), so a month's sum is exact and needs no extrapolation.
The interval judged ends `SETTLE` before the evaluation, not at it. A sample is stamped with the start of its scrape
(or the evaluation that wrote it) and lands later; VictoriaMetrics hides the newest ones for its
`-search.latencyOffset`. Judged at once, a start stamped just before the interval's end would be missing from
that interval and already there at the next one's start: counted in neither.
Two faults of one class on one object within an interval of each other count once. Like the capacity
group, this one reads raw series only, so `promtool tsdb create-blocks-from rules` can compute it over
the past.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import matcher, record
from gpufleet.xid import APPLICATION, DOUBLE_BIT_ECC, FALLEN_OFF_BUS, RESET_OR_REBOOT, ROW_REMAP_FAILURE

# Each interruption is dated to its interval: ten minutes do for a month's count, and cost half of five at
# a thousand nodes (the dense series are read four times an evaluation).
INTERVAL = "10m"
# More than a scrape's interval and timeout, a rule group's evaluation, and VictoriaMetrics' latency offset.
SETTLE = "1m"
GROUP = "gpufleet-reliability"
Signal = Callable[[int], str]  # Where a signal started in the interval ending this many intervals back.
GPU_EVENTS = "instance_gpu:gpufleet_interruptions:new10m"
PORT_EVENTS = "instance_port:gpufleet_interruptions:new10m"
NODE_EVENTS = "instance:gpufleet_interruptions:new10m"
# GPUs, InfiniBand ports and nodes observed, per cluster: the exposure rates are per, and the sign that this
# group ran through a range with no interruption at all.
OBSERVED = "cluster:gpufleet_observed_units:count"

NVLINK_ERROR = 74
CONTAINED_ECC, UNCONTAINED_ECC = 94, 95
MEMORY_XIDS = (DOUBLE_BIT_ECC, ROW_REMAP_FAILURE, CONTAINED_ECC, UNCONTAINED_ECC)
# A GPU off the bus is counted from NVML's lost state, an NVLink error with its link: not here as well.
HARDWARE_XIDS = tuple(x for x in RESET_OR_REBOOT if x not in (*MEMORY_XIDS, FALLEN_OFF_BUS, NVLINK_ERROR))
# 45 is the driver cleaning up after another error, which is already counted.
APPLICATION_XIDS = tuple(x for x in APPLICATION if x != 45)

# class label -> what the report calls it.
CLASSES = {
    "gpu_hardware": "GPU hardware (XID needing a reset)",
    "gpu_application": "GPU application XID",
    "gpu_memory": "GPU memory (uncorrectable ECC, row remap failure)",
    "gpu_lost": "GPU lost (off the bus)",
    "nvlink": "NVLink",
    "network": "InfiniBand port or NIC",
    "thermal": "Thermal slowdown",
    "node_down": "Node or exporter down",
}


def settled(c: Config, intervals: int) -> str:
    """The offset, as PromQL writes it, of the end of the interval `intervals` before the one judged now."""
    back = intervals * duration.parse(c.d(INTERVAL)) + duration.parse(c.d(SETTLE))
    return f" offset {duration.render(back)}"


def reliability(c: Config) -> dict[str, Any]:
    w = c.d(INTERVAL)
    gpu, port, node = c.by("instance", "gpu", "uuid"), c.by("instance", "device", "port"), c.by("instance")
    scraped = c.up()
    was_up = f"on ({node}) ({scraped}{settled(c, 1)} == 1)"

    def grown(selector: str, by: str, sparse: bool = False) -> Signal:
        """Objects whose counter grew in the interval. A sparse counter (an XID's) is created by its first
        event, so its birth counts as growth; a dense one exists from the GPU's or port's first collection, and
        its series returning with a GPU that was lost is no event."""
        def started(shift: int) -> str:
            later = settled(c, shift)
            earlier = f"{selector}{settled(c, shift + 1)}"
            born = f" or ({selector}{later} unless {earlier})" if sparse else ""
            return f"max by ({by}) ((({selector}{later} - {earlier}) > 0){born})"
        return started

    def turned(selector: str, by: str, bad: str, worst: str, good: str | None) -> Signal:
        """Objects seen `bad` (a comparison) at some sample of the interval and `good` at its start. `worst`
        (min for a state that is bad when low) picks the sample, and the series of an object, that decide. A
        sparse state (good: None), whose series exists only while bad, counts where it did not exist at the
        start; a dense one must have been there and good, so that a GPU coming back does not count again."""
        def started(shift: int) -> str:
            now = f"{worst} by ({by}) ({worst}_over_time({selector}[{w}]{settled(c, shift)})) {bad}"
            then = f"{worst} by ({by}) ({selector}{settled(c, shift + 1)})"
            return f"({now} unless {then} {bad})" if good is None else f"({now} and {then} {good})"
        return started

    def events(name: str, by: str, klass: str, *signals: Signal) -> dict[str, Any]:
        """Objects where a signal of the class started in this interval and none in the one before: a burst
        of errors, or two signals of one fault that straddle an interval's end, are one interruption."""
        def any_started(shift: int) -> str:
            return f"max by ({by}) (" + " or ".join(f"({signal(shift)})" for signal in signals) + ")"
        return record(name, f"({any_started(0)} unless {any_started(1)}) * 0 + 1 and {was_up}", **{"class": klass})

    xids = "gpufleet_gpu_xid_errors_total"
    xid_gpu = c.by("instance", "gpu", "uuid", "xid")
    ib = "gpufleet_infiniband_"
    thermal = c.metric("gpufleet_gpu_clock_event_active", 'reason=~"hw_thermal_slowdown|sw_thermal_slowdown"')
    rules = [
        events(GPU_EVENTS, xid_gpu, "gpu_hardware",
               grown(c.metric(xids, matcher(HARDWARE_XIDS)), xid_gpu, sparse=True)),
        events(GPU_EVENTS, xid_gpu, "gpu_application",
               grown(c.metric(xids, matcher(APPLICATION_XIDS)), xid_gpu, sparse=True)),
        events(GPU_EVENTS, gpu, "gpu_memory",
               grown(c.metric(xids, matcher(MEMORY_XIDS)), gpu, sparse=True),
               grown(c.metric("gpufleet_gpu_ecc_errors_total", 'error="uncorrected"', 'scope="volatile"'), gpu),
               turned(c.metric("gpufleet_gpu_row_remap_failed"), gpu, "== 1", "max", "== 0")),
        events(GPU_EVENTS, gpu, "gpu_lost", turned(c.metric("gpufleet_gpu_up"), gpu, "== 0", "min", "== 1")),
        events(GPU_EVENTS, gpu, "nvlink",
               grown(c.metric(xids, f'xid="{NVLINK_ERROR}"'), gpu, sparse=True),
               turned(c.metric("gpufleet_gpu_nvlink_up"), gpu, "== 0", "min", None)),
        events(GPU_EVENTS, gpu, "thermal", turned(thermal, gpu, "== 1", "max", "== 0")),
        events(PORT_EVENTS, port, "network",
               grown(c.metric(f"{ib}link_downed_total"), port),
               turned(c.metric(f"{ib}state_id"), port, "< 4", "min", ">= 4")),
        events(NODE_EVENTS, node, "node_down", turned(scraped, node, "== 0", "min", "== 1")),
        record(OBSERVED, f"count by ({c.by()}) ({c.metric('gpufleet_gpu_info')})", unit="gpu"),
        record(OBSERVED, f"count by ({c.by()}) ({c.metric(f'{ib}state_id')})", unit="port"),
        record(OBSERVED, f"count by ({c.by()}) ({scraped})", unit="node"),
    ]
    return {"name": GROUP, "interval": w, "rules": rules}
