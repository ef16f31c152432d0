"""The capacity report's sections: what the fleet has, what jobs hold, what they make of it, and the trend.

Figures are per cluster and GPU model, over GPU-hours: a subquery counts GPUs in each state at every
step of the range, so a GPU that joined halfway counts for half the range. Allocated means a job is
attributed to the GPU (`gpufleet_gpu_job_info`); idle means healthy and unattributed; lost means the
exporter saw the GPU fall off the bus (`gpufleet_gpu_up == 0`).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from report import charts
from report.document import Section, Table
from report.figures import project, quantile_from_buckets
from report.prometheus import Series
from report.query import Queries, Window

GPU = "cluster, instance, gpu"
JOB = "cluster, scheduler, job_id, namespace, pod"
INFO = "max by (cluster, instance, gpu, name) (gpufleet_gpu_info)"
ALLOCATED = "group by (cluster, instance, gpu) (gpufleet_gpu_job_info)"
UTIL = "gpufleet_gpu_utilization_ratio"
POWER = "gpufleet_gpu_power_watts"
BUCKETS = 20
UTIL_BOUNDS = tuple(round((i + 1) / BUCKETS, 2) for i in range(BUCKETS))
LOW_UTIL = 0.1
TOP = 20
PROJECTION_SHARE = 0.9
TREND_POINTS = 200

Key = tuple[str, str]  # (cluster, GPU model)


class SectionError(Exception):
    """A section cannot say anything true about this range; the message says why."""


@dataclass(frozen=True)
class SectionSpec:
    key: str
    title: str
    requires: tuple[str, ...]  # Metric names; "a|b" is satisfied by either.
    build: Callable[[Queries], Awaitable[Section]]


# Expressions --------------------------------------------------------------------------------------

def _states(by: str) -> str:
    """GPUs by state at one instant, with a `state` label; installed = allocated + idle + lost."""
    healthy = f"({INFO} and on ({GPU}) (gpufleet_gpu_up == 1))"
    parts = {
        "installed": INFO,
        "allocated": f"{healthy} and on ({GPU}) {ALLOCATED}",
        "idle": f"{healthy} unless on ({GPU}) {ALLOCATED}",
        "lost": f"{INFO} and on ({GPU}) (gpufleet_gpu_up == 0)",
    }
    return " or ".join(f'label_replace(count by ({by}) ({expr}), "state", "{state}", "", "")'
                       for state, expr in parts.items())


def _model_over(w: Window) -> str:
    """Each GPU seen in the range with its model, for joining per-GPU figures that span the range."""
    return f"max by ({GPU}, name) (max_over_time({w.over('gpufleet_gpu_info')}))"


def _by_model(per_gpu: str, w: Window) -> str:
    return f"sum by (cluster, name) (({per_gpu}) * on ({GPU}) group_left (name) {_model_over(w)})"


def _grown(selector: str, on: str, w: Window) -> str:
    """How much a counter grew in the range: its largest value less its value at the start, or all of it
    for a series born inside the range (an XID counter is created by its first event, which `increase()`
    would miss). Sampled at the step, never over raw samples: a raw 30-day range would load every scrape.
    Counters that restart inside the range (XIDs, with the exporter) count from the restart.
    """
    largest = f"max_over_time({w.over(selector)})"
    return f"({largest} unless on ({on}) {selector} offset {w.r}) or ({largest} - on ({on}) {selector} offset {w.r})"


# Formatting ---------------------------------------------------------------------------------------

def _hours(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _cluster(labels: dict[str, str]) -> str:
    return labels.get("cluster", "") or "—"


def _key(labels: dict[str, str]) -> Key:
    return _cluster(labels), labels.get("name", "") or "unknown model"


def _per_model(result: list[Series]) -> dict[Key, float]:
    totals: dict[Key, float] = defaultdict(float)
    for series in result:
        totals[_key(series.labels)] += series.values[-1][1]
    return dict(totals)


def _per_state(result: list[Series]) -> dict[Key, dict[str, float]]:
    states: dict[Key, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for series in result:
        states[_key(series.labels)][series.labels["state"]] += series.values[-1][1]
    return states


def _ident(series: Series, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(series.labels.get(name, "") for name in names)


def _by_labels(result: list[Series], names: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    return {_ident(series, names): series.values[-1][1] for series in result}


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole


def _need(values: dict[Key, float], what: str) -> dict[Key, float]:
    if not values:
        raise SectionError(f"no {what} in the range")
    return values


# Sections -----------------------------------------------------------------------------------------

async def inventory(q: Queries) -> Section:
    w = q.window
    now, hours = await asyncio.gather(q.at_end(_states("cluster, name")),
                                      q.at_end(f"sum_over_time({w.over(_states('cluster, name'))})"))
    at_end, over = _per_state(now), _per_state(hours)
    if not over:
        raise SectionError("no GPU was seen in the range")
    rows = []
    for key in sorted(over.keys() | at_end.keys()):
        end, span = at_end.get(key, {}), over.get(key, {})
        rows.append((*key, _count(end.get("installed", 0)),
                     _count(end.get("allocated", 0) + end.get("idle", 0)), _count(end.get("lost", 0)),
                     _hours(span.get("installed", 0) * w.hours_per_point),
                     _hours(span.get("lost", 0) * w.hours_per_point)))
    installed = sum(s.get("installed", 0) for s in at_end.values())
    lost = sum(s.get("lost", 0) for s in at_end.values())
    return Section("inventory", "Inventory", "GPUs at the end of the period, and GPU-hours over it.",
                   findings=[f"{installed:,.0f} GPUs installed at the end of the period, {lost:,.0f} of them lost."],
                   tables=[Table("GPUs by cluster and model",
                                 ("Cluster", "Model", "Installed", "Healthy", "Lost", "GPU-hours installed",
                                  "GPU-hours lost"), rows)])


async def allocation(q: Queries) -> Section:
    w = q.window
    over = _per_state(await q.at_end(f"sum_over_time({w.over(_states('cluster, name'))})"))
    if not over:
        raise SectionError("no GPU was seen in the range")
    rows, bars = [], []
    total = defaultdict(float)
    for key in sorted(over):
        span = {state: over[key].get(state, 0) * w.hours_per_point
                for state in ("installed", "allocated", "idle", "lost")}
        for state, value in span.items():
            total[state] += value
        rows.append((*key, _hours(span["installed"]), _hours(span["allocated"]), _hours(span["idle"]),
                     _hours(span["lost"]), _pct(_share(span["allocated"], span["installed"])),
                     _pct(_share(span["idle"], span["installed"]))))
        bars.append((" / ".join(k for k in key if k != "—"), span["allocated"], span["idle"], span["lost"]))
    idle = _share(total["idle"], total["installed"])
    return Section(
        "allocation", "Allocated and idle GPU-hours",
        "Allocated: a job was attributed to the GPU. Idle: healthy, no job. Lost: fallen off the bus.",
        findings=[f"{_pct(_share(total['allocated'], total['installed']))} of installed GPU-hours were allocated "
                  f"and {_pct(idle)} idle ({_hours(total['idle'])} GPU-hours)."],
        tables=[Table("GPU-hours by cluster and model",
                      ("Cluster", "Model", "Installed", "Allocated", "Idle", "Lost", "Allocated share", "Idle share"),
                      rows)],
        charts=[charts.gpu_hours(bars)])


def _cumulative(buckets: dict[float, float]) -> list[float]:
    """Samples below each of UTIL_BOUNDS, from counts per bucket keyed by the bucket's lower edge."""
    return [sum(n for low, n in buckets.items() if low < bound - 1e-9) for bound in UTIL_BOUNDS]


async def utilisation(q: Queries) -> Section:
    w = q.window
    held = f"{UTIL} and on ({GPU}) {ALLOCATED}"
    # One pass over the raw utilisation for the whole distribution: count_values buckets each sample.
    modelled = f"{UTIL} * on ({GPU}) group_left (name) ({INFO} and on ({GPU}) {ALLOCATED})"
    histogram = f'count_values by (cluster, name) ("bucket", floor({BUCKETS} * ({modelled})) / {BUCKETS})'
    counted, summed, used_all = await asyncio.gather(q.at_end(f"sum_over_time({w.over(histogram)})"),
                                                     q.at_end(_by_model(f"sum_over_time({w.over(held)})", w)),
                                                     q.at_end(_by_model(f"sum_over_time({w.over(UTIL)})", w)))
    buckets: dict[Key, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for series in counted:
        buckets[_key(series.labels)][min(1.0, max(0.0, float(series.labels["bucket"])))] += series.values[-1][1]
    if not buckets:
        raise SectionError("no utilisation samples of allocated GPUs in the range")
    sums, used = _per_model(summed), _per_model(used_all)
    rows, histograms = [], {}
    low_index = UTIL_BOUNDS.index(LOW_UTIL)
    all_low = all_samples = 0.0
    for key in sorted(buckets):
        total = sum(buckets[key].values())
        below = _cumulative(buckets[key])
        p50, p95 = (quantile_from_buckets(p, UTIL_BOUNDS, below, total) for p in (0.5, 0.95))
        all_low, all_samples = all_low + below[low_index], all_samples + total
        rows.append((*key, _hours(used.get(key, 0) * w.hours_per_point), _hours(total * w.hours_per_point),
                     _pct(sums.get(key, 0) / total), _pct(p50), _pct(p95), _pct(below[low_index] / total)))
        deciles = [0.0, *below[1::2]]  # Every other 5% bound: ten 10% bars read better than twenty.
        deciles[-1] = total  # Samples at exactly 100% belong in the top bar.
        histograms[" / ".join(k for k in key if k != "—")] = [
            (i / 10, (i + 1) / 10, (deciles[i + 1] - deciles[i]) / total) for i in range(10)]
    return Section(
        "utilisation", "Utilisation of allocated GPUs",
        "Over allocated GPU-hours. Used GPU-hours weight every GPU-hour by its utilisation (all GPUs). Quantiles "
        f"are read from utilisation buckets {1 / BUCKETS:.0%} wide, so they are exact to that.",
        findings=[f"{_pct(all_low / all_samples)} of allocated GPU-hours ran below {LOW_UTIL:.0%} utilisation."],
        tables=[Table("Utilisation by cluster and model",
                      ("Cluster", "Model", "GPU-hours used", "GPU-hours allocated", "Mean", "p50", "p95",
                       f"Below {LOW_UTIL:.0%}"), rows)],
        charts=[charts.utilisation(histograms)])


async def memory(q: Queries) -> Section:
    w = q.window
    free = f"gpufleet_gpu_memory_free_bytes and on ({GPU}) {ALLOCATED}"
    total = f"gpufleet_gpu_memory_total_bytes and on ({GPU}) {ALLOCATED}"
    ratio = f"gpufleet_gpu_memory_free_bytes / gpufleet_gpu_memory_total_bytes and on ({GPU}) {ALLOCATED}"
    free_sum, total_sum, lowest = await asyncio.gather(
        q.at_end(_by_model(f"sum_over_time({w.over(free)})", w)),
        q.at_end(_by_model(f"sum_over_time({w.over(total)})", w)),
        q.at_end(f"min_over_time({w.over(ratio)}) * on ({GPU}) group_left (name) {_model_over(w)}"))
    totals = _need(_per_model(total_sum), "memory samples of allocated GPUs")
    frees = _per_model(free_sum)
    tights, helds = defaultdict(int), defaultdict(int)  # Per model: GPUs below 10% free at some point; all.
    for series in lowest:
        helds[_key(series.labels)] += 1
        tights[_key(series.labels)] += series.values[-1][1] < 0.1
    rows = [(*key, _pct(frees.get(key, 0) / totals[key]), _count(tights.get(key, 0)), _count(helds.get(key, 0)))
            for key in sorted(totals)]
    return Section("memory", "Memory headroom",
                   "Free GPU memory as a share of total, over allocated GPU-hours; and the allocated GPUs whose "
                   "free memory fell below 10% at some point in the period.",
                   tables=[Table("Memory headroom by cluster and model",
                                 ("Cluster", "Model", "Mean headroom", "GPUs below 10% free", "GPUs allocated"),
                                 rows)])


async def energy(q: Queries) -> Section:
    w = q.window
    power_limit = f"{POWER} / gpufleet_gpu_power_limit_watts"
    joules, watts, samples, of_limit, capped, peak = await asyncio.gather(
        q.at_end(_by_model(f"sum_over_time({w.over(f'rate(gpufleet_gpu_energy_joules_total[{w.rate_window}])')})"
                           f" * {w.step}", w)),
        q.at_end(_by_model(f"sum_over_time({w.over(POWER)})", w)),
        q.at_end(_by_model(f"count_over_time({w.over(POWER)})", w)),
        q.at_end(_by_model(f"sum_over_time({w.over(power_limit)})", w)),
        q.at_end(_by_model(f"sum_over_time({w.over(f'{power_limit} >= bool 0.95')})", w)),
        q.at_end(f"max_over_time({w.over(f'sum by (cluster) ({POWER})')})"))
    counts = _need(_per_model(samples), "GPU power samples")
    kwh, power, shares, at_cap = (_per_model(r) for r in (joules, watts, of_limit, capped))
    rows = [(*key, f"{kwh[key] / 3.6e6:,.0f}" if key in kwh else "—", f"{power.get(key, 0) / counts[key]:,.0f} W",
             _pct(shares.get(key, 0) / counts[key]) if shares else "—",
             _pct(at_cap.get(key, 0) / counts[key]) if shares else "—") for key in sorted(counts)]
    draws = [(_cluster(s.labels), f"{s.values[-1][1] / 1000:,.1f} kW") for s in peak]
    total_kwh = sum(kwh.values()) / 3.6e6
    return Section(
        "energy", "Energy and power",
        "Energy from the GPUs' own counters (board power only: no CPUs, fans or cooling). Power against the "
        "enforced limit; a GPU at 95% of its limit or more is likely being capped.",
        findings=[f"The GPUs used {total_kwh:,.0f} kWh in the period."],
        tables=[Table("Energy and power by cluster and model",
                      ("Cluster", "Model", "Energy (kWh)", "Mean power per GPU", "Mean share of limit",
                       "GPU-hours at 95% of limit or more"), rows),
                Table("Peak GPU power draw by cluster", ("Cluster", "Peak draw"), sorted(draws))])


async def health(q: Queries) -> Section:
    w = q.window
    xid_on = "cluster, instance, job, gpu, uuid, xid"
    ecc = 'gpufleet_gpu_ecc_errors_total{error="uncorrected",scope="aggregate"}'
    models, xids, eccs, pending, failed, lost, missing = await asyncio.gather(
        q.at_end(_model_over(w)),
        q.at_end(f"sum by ({GPU}, xid) ({_grown('gpufleet_gpu_xid_errors_total', xid_on, w)}) > 0"),
        q.at_end(f"sum by ({GPU}) ({_grown(ecc, 'cluster, instance, job, gpu, uuid, error, scope', w)}) > 0"),
        q.at_end(f"max by ({GPU}) (max_over_time({w.over('gpufleet_gpu_row_remap_pending')})) > 0"),
        q.at_end(f"max by ({GPU}) (max_over_time({w.over('gpufleet_gpu_row_remap_failed')})) > 0"),
        q.at_end(f"sum by ({GPU}) (sum_over_time({w.over('gpufleet_gpu_up == bool 0')})) > 0"),
        q.at_end("max by (cluster, instance) (max_over_time("
                 f"{w.over('gpufleet_gpu_pci_devices - gpufleet_gpu_devices')})) > 0"))
    if not models:
        raise SectionError("no GPU was seen in the range")
    model = {(_cluster(s.labels), s.labels.get("instance", ""), s.labels.get("gpu", "")): s.labels.get("name", "")
             for s in models}
    problems: dict[tuple[str, str, str], dict[str, str]] = defaultdict(dict)

    def gpu(series: Series) -> dict[str, str]:
        return problems[(_cluster(series.labels), series.labels.get("instance", ""), series.labels.get("gpu", ""))]

    for series in xids:
        found = gpu(series)
        found["xid"] = ", ".join(filter(None, [found.get("xid"), f"{series.labels['xid']} ×{series.values[-1][1]:g}"]))
    for series in eccs:
        gpu(series)["ecc"] = f"{series.values[-1][1]:g}"
    for series in pending:
        gpu(series)["remap"] = "pending"
    for series in failed:
        gpu(series)["remap"] = "failed"
    for series in lost:
        gpu(series)["lost"] = _hours(series.values[-1][1] * w.hours_per_point)
    rows = [(cluster, instance, g, model.get((cluster, instance, g), ""), p.get("xid", ""), p.get("ecc", ""),
             p.get("remap", ""), p.get("lost", "")) for (cluster, instance, g), p in sorted(problems.items())]
    nodes = [(_cluster(s.labels), s.labels.get("instance", ""), f"{s.values[-1][1]:g}") for s in missing]
    per_model: dict[Key, int] = defaultdict(int)
    for (cluster, instance, g) in problems:
        per_model[(cluster, model.get((cluster, instance, g), "") or "unknown model")] += 1
    return Section(
        "health", "GPUs with health problems",
        "Any critical XID, new uncorrectable ECC error, row remap pending or failed, or time fallen off the bus.",
        findings=[f"{len(problems)} of {len(model)} GPUs had a health problem in the period."],
        tables=[Table("GPUs with health problems", ("Cluster", "Node", "GPU", "Model", "XIDs (code ×count)",
                                                    "Uncorrectable ECC", "Row remap", "Hours lost"), rows),
                Table("Nodes where NVML missed GPUs on the PCI bus", ("Cluster", "Node", "Most GPUs missing"),
                      sorted(nodes)),
                Table("GPUs with health problems by cluster and model", ("Cluster", "Model", "GPUs"),
                      [(*k, str(v)) for k, v in sorted(per_model.items())])])


async def stragglers(q: Queries) -> Section:
    w = q.window
    job = "cluster, scheduler, job_id"
    clock = (f'avg by ({job}, instance) (gpufleet_gpu_job_info{{job_id!=""}} * on ({GPU}, uuid) group_left '
             f'avg_over_time(gpufleet_gpu_clock_hertz{{clock="sm"}}[{w.rate_window}]))')
    relative = (f"(({clock} / on ({job}) group_left max by ({job}) ({clock})) "
                f"and on ({job}) (count by ({job}) ({clock}) >= 2))")
    slow, worst = await asyncio.gather(
        q.at_end(f"sum_over_time({w.over(f'{relative} < bool 0.75')}) > 0"),
        q.at_end(f"min_over_time({w.over(relative)})"))
    if not worst:
        raise SectionError("no job with two or more nodes in the range")
    names = ("cluster", "scheduler", "job_id", "instance")
    lowest = _by_labels(worst, names)
    rows = []
    for s in sorted(slow, key=lambda s: (-s.values[-1][1], _ident(s, names))):
        ident = _ident(s, names)
        rows.append((_cluster(s.labels), s.labels.get("instance", ""), f"{ident[1]} {ident[2]}",
                     _hours(s.values[-1][1] * w.hours_per_point), _pct(lowest.get(ident))))
    return Section("stragglers", "Nodes that straggled",
                   "A node straggles while its mean SM clock is below 75% of the fastest node's in the same job "
                   "(jobs of two nodes or more), measured at every step of the range.",
                   findings=[f"Nodes that straggled in the period: {len({(r[0], r[1]) for r in rows})}."],
                   tables=[Table("Straggling nodes", ("Cluster", "Node", "Job", "Hours straggling",
                                                      "Lowest clock against the fastest node"), rows[:TOP * 5])])


def _links(w: Window) -> str:
    ib = "on (cluster, instance, device, port) gpufleet_infiniband_rate_bytes_per_second > 0"
    eth = "on (cluster, instance, device) gpufleet_network_speed_bytes_per_second > 0"
    parts = [
        (f"rate(gpufleet_infiniband_port_xmit_data_bytes_total[{w.rate_window}]) / {ib}", "transmit"),
        (f"rate(gpufleet_infiniband_port_rcv_data_bytes_total[{w.rate_window}]) / {ib}", "receive"),
        (f"rate(gpufleet_network_transmit_bytes_total[{w.rate_window}]) / {eth}", "transmit"),
        (f"rate(gpufleet_network_receive_bytes_total[{w.rate_window}]) / {eth}", "receive"),
    ]
    return " or ".join(f'label_replace({expr}, "direction", "{d}", "", "")' for expr, d in parts)


async def network(q: Queries) -> Section:
    w = q.window
    peak, p95 = await asyncio.gather(q.at_end(f"max_over_time({w.over(_links(w))})"),
                                     q.at_end(f"quantile_over_time(0.95, {w.over(_links(w))})"))
    if not peak:
        raise SectionError("no link throughput in the range")

    names = ("cluster", "instance", "device", "port", "direction")
    peaks = _by_labels(peak, names)
    ranked = sorted(((s.values[-1][1], _ident(s, names)) for s in p95), reverse=True)
    busy = sum(1 for value, _ in ranked if value >= 0.8)
    rows = [(_cluster({"cluster": i[0]}), i[1], f"{i[2]}/{i[3]}" if i[3] else i[2],
             "InfiniBand" if i[3] else "Ethernet", i[4], _pct(value), _pct(peaks.get(i)))
            for value, i in ranked[:TOP]]
    return Section("network", "Network links",
                   f"Link throughput against link speed, averaged over each {w.rate_window} step; the busiest "
                   f"{TOP} links by p95.",
                   findings=[f"{busy} of {len(ranked)} link directions spent 5% or more of the period at 80% of "
                             "line rate or above."],
                   tables=[Table("Busiest links", ("Cluster", "Node", "Port", "Kind", "Direction", "p95", "Peak"),
                                 rows)])


async def jobs(q: Queries) -> Section:
    w = q.window
    gpus = f"count by ({JOB}) (gpufleet_gpu_job_info)"
    busy = f"sum by ({JOB}) (gpufleet_gpu_job_info * on ({GPU}, uuid) group_left {UTIL})"
    nodes = f"count by ({JOB}) (group by ({JOB}, instance) (gpufleet_gpu_job_info))"
    top, used, widest, spread = await asyncio.gather(
        q.at_end(f"topk({TOP}, sum_over_time({w.over(gpus)}))"),
        q.at_end(f"sum_over_time({w.over(busy)})"),
        q.at_end(f"max_over_time({w.over(gpus)})"),
        q.at_end(f"max_over_time({w.over(nodes)})"))
    if not top:
        raise SectionError("no job was attributed to a GPU in the range")

    names = ("cluster", "scheduler", "job_id", "namespace", "pod")
    used_by, widest_by, nodes_by = (_by_labels(r, names) for r in (used, widest, spread))
    rows = []
    for s in sorted(top, key=lambda s: (-s.values[-1][1], _ident(s, names))):
        i = _ident(s, names)
        name = f"{i[1]} {i[2]}" if i[2] else f"{i[3]}/{i[4]}"
        rows.append((_cluster(s.labels), name.strip(), _hours(s.values[-1][1] * w.hours_per_point),
                     _pct(used_by.get(i, 0) / s.values[-1][1]), _count(widest_by.get(i, 0)),
                     _count(nodes_by.get(i, 0))))
    return Section("jobs", "Top jobs by GPU-hours", "Jobs are Slurm job ids, or Kubernetes pods.",
                   tables=[Table(f"Top {TOP} jobs", ("Cluster", "Job", "GPU-hours", "Mean utilisation",
                                                     "Most GPUs", "Most nodes"), rows)])


async def trend(q: Queries) -> Section:
    w = q.window
    step = max(w.step, -(-w.seconds // TREND_POINTS) // w.step * w.step)
    used = f'label_replace(sum by (cluster) ({UTIL}), "state", "used", "", "")'
    result = await q.over_range(f"{_states('cluster')} or {used}", step)
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(dict)
    for s in result:
        series[_cluster(s.labels)][s.labels["state"]] = s.values
    if not series:
        raise SectionError("no GPU was seen in the range")
    rows, drawn, findings = [], [], []
    for cluster in sorted(series):
        lines = series[cluster]
        installed = lines.get("installed", [(w.end, 0.0)])[-1][1]
        allocated = lines.get("allocated", [])
        projection = project(allocated, installed, PROJECTION_SHARE)
        share = f"{PROJECTION_SHARE:.0%} of the fleet"
        if projection is None or projection.days_to_target is None:
            when = "not at the current growth"
            findings.append(f"{cluster}: allocation is not growing towards {share}.")
        elif projection.days_to_target == 0:
            when = "already reached"
            findings.append(f"{cluster}: allocation is already at {share} or more.")
        else:
            when = time.strftime("%Y-%m-%d", time.gmtime(w.end + projection.days_to_target * 86400))
            findings.append(f"{cluster}: at {projection.slope_per_day:+.2f} GPUs a day, allocation reaches {share} "
                            f"on {when}, in {projection.days_to_target:,.0f} days.")
        rows.append((cluster, _count(installed), _count(allocated[-1][1]) if allocated else "0",
                     f"{projection.slope_per_day:+.2f}" if projection else "—",
                     _count(PROJECTION_SHARE * installed), when))
        drawn.append(charts.trend(cluster, lines, projection, w.end))
    return Section(
        "trend", "Trend and projection",
        f"Allocated and used GPUs over the period, with a straight line fitted to allocation and projected to "
        f"{PROJECTION_SHARE:.0%} of the GPUs installed at the end. Planned step changes (a new tenant, a "
        "cluster going live) are not in the data and not in the projection.",
        findings=findings,
        tables=[Table("Projection by cluster", ("Cluster", "Installed", "Allocated at end", "Growth (GPUs/day)",
                                                f"{PROJECTION_SHARE:.0%} of installed", "Reaches it"), rows)],
        charts=drawn)


SECTIONS = (
    SectionSpec("inventory", "Inventory", ("gpufleet_gpu_info", "gpufleet_gpu_up"), inventory),
    SectionSpec("allocation", "Allocated and idle GPU-hours",
                ("gpufleet_gpu_info", "gpufleet_gpu_up", "gpufleet_gpu_job_info"), allocation),
    SectionSpec("utilisation", "Utilisation of allocated GPUs",
                ("gpufleet_gpu_info", "gpufleet_gpu_job_info", UTIL), utilisation),
    SectionSpec("memory", "Memory headroom", ("gpufleet_gpu_info", "gpufleet_gpu_job_info",
                                              "gpufleet_gpu_memory_free_bytes", "gpufleet_gpu_memory_total_bytes"),
                memory),
    SectionSpec("energy", "Energy and power", ("gpufleet_gpu_info", POWER, "gpufleet_gpu_energy_joules_total",
                                               "gpufleet_gpu_power_limit_watts"), energy),
    SectionSpec("health", "GPUs with health problems", ("gpufleet_gpu_info", "gpufleet_gpu_up"), health),
    SectionSpec("stragglers", "Nodes that straggled", ("gpufleet_gpu_job_info", "gpufleet_gpu_clock_hertz"),
                stragglers),
    SectionSpec("network", "Network links", ("gpufleet_infiniband_port_xmit_data_bytes_total|"
                                             "gpufleet_network_transmit_bytes_total",), network),
    SectionSpec("jobs", "Top jobs by GPU-hours", ("gpufleet_gpu_job_info", UTIL), jobs),
    SectionSpec("trend", "Trend and projection", ("gpufleet_gpu_info", "gpufleet_gpu_up", "gpufleet_gpu_job_info",
                                                  UTIL), trend),
)
