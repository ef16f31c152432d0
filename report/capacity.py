"""The capacity report's sections: what the fleet has, what jobs hold, what they make of it, and the trend.

Every section reads the series of the `gpufleet-capacity-*` rule groups (alerts/capacity.py), not the
exporters' raw series: the joins and aggregations over every GPU are paid once per evaluation as
the data arrives, so a month of a thousand nodes is a few thousand small series to read here.
Figures are per cluster and GPU model, over GPU-hours: a subquery reads the GPUs in each state at
every step of the range, so a GPU that joined halfway counts for half the range. Allocated means a
job is attributed to the GPU; idle, healthy and unattributed; lost, fallen off the bus.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from gpufleet.alerts import capacity as rec
from gpufleet.alerts.config import Config
from gpufleet.duration import spoken
from gpufleet.report import charts
from gpufleet.report.document import Section, Table
from gpufleet.report.figures import project, quantile_from_buckets
from gpufleet.report.prometheus import Series
from gpufleet.report.query import Queries, Window
from gpufleet.report.spec import ReportSpec, SectionError, SectionSpec, cluster_note

UTIL_BOUNDS = tuple(round((i + 1) / rec.BUCKETS, 2) for i in range(rec.BUCKETS))
LOW_UTIL = 0.1
TOP = 20
PROJECTION_SHARE = 0.9
TREND_POINTS = 200

INSTALLED = f'{rec.GPUS}{{state="installed"}}'

Key = tuple[str, str]  # (cluster, GPU model)


# Expressions --------------------------------------------------------------------------------------

def _grown(selector: str, on: str, w: Window) -> str:
    """How much a counter grew in the range: its largest value less its value at the start, or all of it
    for a series born inside the range (an XID counter is created by its first event, which `increase()`
    would miss). Only for sparse series, that exist for the few GPUs with a problem: the range is raw.
    Counters that restart inside the range (XIDs, with the exporter) count from the restart.
    """
    largest = f"max_over_time({selector}[{w.r}])"
    return f"({largest} unless on ({on}) {selector} offset {w.r}) or ({largest} - on ({on}) {selector} offset {w.r})"


def _summed(w: Window, recorded: str) -> str:
    """A recorded series summed over the range's points; times the step in hours, that is GPU-hours."""
    return f"sum_over_time({w.over(recorded)})"


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
    now, hours = await asyncio.gather(q.at_end(rec.GPUS), q.at_end(_summed(w, rec.GPUS)))
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
    over = _per_state(await q.at_end(_summed(w, rec.GPUS)))
    if not over:
        raise SectionError("no GPU was seen in the range")
    rows, bars = [], []
    total: dict[str, float] = defaultdict(float)
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


async def _doing_math(q: Queries, allocated: dict[Key, float]) -> tuple[list[str], Table]:
    """Busy beside doing math: GPU-hours weighted by NVML utilisation, by SM activity and by tensor activity,
    over the allocated GPUs whose board has GPM. The others' hours are named, never counted as no work."""
    w = q.window
    gpm_gpus, busy, sm_active, tensor = (_per_model(r) for r in await asyncio.gather(
        *(q.at_end(_summed(w, recorded)) for recorded in (rec.GPM_GPUS, rec.GPM_USED, rec.SM_ACTIVE,
                                                          rec.TENSOR_ACTIVE))))
    hours = w.hours_per_point
    rows = []
    for key in sorted(allocated):
        measured = gpm_gpus.get(key, 0.0)
        if not measured:
            rows.append((*key, "0", _hours(allocated[key] * hours), "—", "—", "—"))
            continue
        rows.append((*key, _hours(measured * hours), _hours(max(0.0, allocated[key] - measured) * hours),
                     _pct(busy.get(key, 0) / measured), _pct(sm_active.get(key, 0) / measured),
                     _pct(tensor.get(key, 0) / measured)))
    table = Table("Busy and doing math, allocated GPUs with GPM",
                  ("Cluster", "Model", "GPU-hours with GPM", "GPU-hours without GPM (not counted)",
                   "NVML utilisation", "SM active", "Tensor active"), rows)
    measured_hours = sum(gpm_gpus.values())
    without = sorted(" / ".join(k for k in key if k != "—") for key in allocated if not gpm_gpus.get(key))
    if not measured_hours:
        return ["No allocated GPU reported GPM (Hopper and newer), so there is no measure of the work done "
                "beyond NVML's utilisation."], table
    findings = [f"Over {_hours(measured_hours * hours)} allocated GPU-hours with GPM, NVML counted "
                f"{_pct(sum(busy.values()) / measured_hours)} busy; the SMs were active "
                f"{_pct(sum(sm_active.values()) / measured_hours)} and the tensor pipes "
                f"{_pct(sum(tensor.values()) / measured_hours)}."]
    if without:
        findings.append(f"Without GPM, left out of that measure rather than counted as idle: {', '.join(without)}.")
    return findings, table


async def utilisation(q: Queries) -> Section:
    w = q.window
    counted, summed, used_all, states = await asyncio.gather(q.at_end(_summed(w, rec.ALLOCATED_BUCKETS)),
                                                             q.at_end(_summed(w, rec.ALLOCATED_USED)),
                                                             q.at_end(_summed(w, rec.USED)),
                                                             q.at_end(_summed(w, rec.GPUS)))
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
    allocated = {key: by_state.get("allocated", 0) for key, by_state in _per_state(states).items()}
    math_findings, math_table = await _doing_math(q, {key: n for key, n in allocated.items() if n})
    return Section(
        "utilisation", "Utilisation of allocated GPUs",
        "Over allocated GPU-hours. Used GPU-hours weight every GPU-hour by its utilisation (all GPUs). Quantiles "
        f"are read from utilisation buckets {1 / rec.BUCKETS:.0%} wide, so they are exact to that. NVML's "
        "utilisation is the share of time any kernel ran: NCCL waiting for a slow peer counts as busy. On boards "
        "with GPM (Hopper and newer), the share of SMs active and of time the tensor pipes worked say how much "
        "of that was work.",
        findings=[f"{_pct(all_low / all_samples)} of allocated GPU-hours ran below {LOW_UTIL:.0%} utilisation.",
                  *math_findings],
        tables=[Table("Utilisation by cluster and model",
                      ("Cluster", "Model", "GPU-hours used", "GPU-hours allocated", "Mean", "p50", "p95",
                       f"Below {LOW_UTIL:.0%}"), rows), math_table],
        charts=[charts.utilisation(histograms)])


async def memory(q: Queries) -> Section:
    w = q.window
    free_sum, total_sum, tight, lowest, states = await asyncio.gather(
        q.at_end(_summed(w, rec.MEMORY_FREE)), q.at_end(_summed(w, rec.MEMORY_TOTAL)),
        q.at_end(_summed(w, rec.MEMORY_TIGHT)), q.at_end(f"min_over_time({rec.MEMORY_LOWEST}[{w.r}])"),
        q.at_end(_summed(w, rec.GPUS)))
    totals = _need(_per_model(total_sum), "memory samples of allocated GPUs")
    frees, tights, lowests = _per_model(free_sum), _per_model(tight), _per_model(lowest)
    held = {key: by_state.get("allocated", 0) for key, by_state in _per_state(states).items()}
    rows = [(*key, _pct(frees.get(key, 0) / totals[key]), _pct(_share(tights.get(key, 0), held.get(key))),
             _pct(lowests.get(key))) for key in sorted(totals)]
    return Section("memory", "Memory headroom",
                   "Free GPU memory as a share of total, over allocated GPU-hours; the share of allocated "
                   f"GPU-hours with less than {rec.TIGHT_MEMORY:.0%} free, and the lowest any GPU reached.",
                   tables=[Table("Memory headroom by cluster and model",
                                 ("Cluster", "Model", "Mean headroom",
                                  f"Share of GPU-hours below {rec.TIGHT_MEMORY:.0%} free", "Lowest headroom"), rows)])


async def energy(q: Queries) -> Section:
    w = q.window
    joules, watts, samples, of_limit, capped, peak = await asyncio.gather(
        q.at_end(f"{_summed(w, rec.ENERGY)} * {w.step}"), q.at_end(_summed(w, rec.POWER)),
        q.at_end(_summed(w, rec.POWER_GPUS)), q.at_end(_summed(w, rec.POWER_OF_LIMIT)),
        q.at_end(_summed(w, rec.POWER_CAPPED)),
        q.at_end(f"max_over_time({w.over(f'sum by ({q.by()}) ({rec.POWER})')})"))
    node_findings, node_tables = await _node_power(q)
    counts = _need(_per_model(samples), "GPU power samples")
    kwh, power, shares, at_cap = (_per_model(r) for r in (joules, watts, of_limit, capped))
    rows = [(*key, f"{kwh[key] / 3.6e6:,.0f}" if key in kwh else "—", f"{power.get(key, 0) / counts[key]:,.0f} W",
             _pct(shares.get(key, 0) / counts[key]) if shares else "—",
             _pct(at_cap.get(key, 0) / counts[key]) if shares else "—") for key in sorted(counts)]
    draws = [(_cluster(s.labels), f"{s.values[-1][1] / 1000:,.1f} kW") for s in peak]
    total_kwh = sum(kwh.values()) / 3.6e6
    return Section(
        "energy", "Energy and power",
        "Energy from the GPUs' own counters (board power only: no CPUs, fans or cooling), and from the "
        "nodes' own power meters where they have one (the whole node, still without cooling). Power against "
        f"the enforced limit; a GPU at {rec.CAPPED_POWER:.0%} of its limit or more is likely being capped.",
        findings=[f"The GPUs used {total_kwh:,.0f} kWh in the period.", *node_findings],
        tables=[Table("Energy and power by cluster and model",
                      ("Cluster", "Model", "Energy (kWh)", "Mean power per GPU", "Mean share of limit",
                       f"GPU-hours at {rec.CAPPED_POWER:.0%} of limit or more"), rows),
                *node_tables,
                Table("Peak GPU power draw by cluster", ("Cluster", "Peak draw"), sorted(draws))])


async def _node_power(q: Queries) -> tuple[list[str], list[Table]]:
    """Whole-node power, from the nodes that meter it: what a planner needs beside the boards' share, since
    a node's CPUs, NICs and fans draw power the GPUs' counters never see. Nodes without a meter are named
    as such, never counted as drawing nothing."""
    w = q.window
    nodes, metered, node_watts, node_samples, gpu_watts = await asyncio.gather(
        q.at_end(f"max_over_time({w.over(rec.NODES)})"), q.at_end(f"max_over_time({w.over(rec.METERED_NODES)})"),
        q.at_end(_summed(w, rec.NODE_POWER)), q.at_end(_summed(w, rec.METERED_NODES)),
        q.at_end(_summed(w, rec.METERED_GPU_POWER)))
    all_nodes, with_meter, watts, samples, gpus = (_per_model(r) for r in
                                                   (nodes, metered, node_watts, node_samples, gpu_watts))
    if not samples:
        return ["No node reported its own power (an ACPI power meter under hwmon): energy counts the GPUs only."], []
    rows = [(*key, f"{with_meter.get(key, 0):,.0f} of {all_nodes.get(key, 0):,.0f}",
             f"{watts[key] * w.step / 3.6e6:,.0f}", f"{watts[key] / samples[key] / 1000:,.2f} kW",
             _pct(_share(gpus.get(key), watts[key]))) for key in sorted(samples)]
    node_kwh, gpu_kwh = sum(watts.values()) * w.step / 3.6e6, sum(gpus.values()) * w.step / 3.6e6
    finding = (f"The nodes with their own power meter used {node_kwh:,.0f} kWh, "
               f"{_pct(_share(gpu_kwh, node_kwh))} of it in their GPUs.")
    return [finding], [Table("Node power, where the node meters it",
                             ("Cluster", "Model", "Nodes metered", "Energy (kWh)", "Mean power per node",
                              "GPUs' share"), rows)]


async def health(q: Queries) -> Section:
    w = q.window
    xid_on, gpu_key = q.by("instance", "job", "gpu", "uuid", "xid"), q.by(*rec.GPU)
    xids_total = q.config.metric("gpufleet_gpu_xid_errors_total")
    models, installed, xids, eccs, pending, failed, lost, missing = await asyncio.gather(
        q.at_end(f"max by ({gpu_key}, name) ({q.config.metric('gpufleet_gpu_info')})"),
        q.at_end(f"max_over_time({w.over(f'sum({INSTALLED})')})"),
        q.at_end(f"sum by ({gpu_key}, xid) ({_grown(xids_total, xid_on, w)}) > 0"),
        q.at_end(f"{_grown(rec.ECC, gpu_key, w)} > 0"),
        q.at_end(f"max_over_time({rec.REMAP_PENDING}[{w.r}])"),
        q.at_end(f"max_over_time({rec.REMAP_FAILED}[{w.r}])"),
        q.at_end(_summed(w, rec.LOST)),
        q.at_end(f"max_over_time({rec.PCI_MISSING}[{w.r}])"))
    if not installed:
        raise SectionError("no GPU was seen in the range")
    model = {(_cluster(s.labels), s.labels.get("instance", ""), s.labels.get("gpu", "")): s.labels.get("name", "")
             for s in (*models, *eccs, *pending, *failed, *lost)}
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
        "Any critical XID, new uncorrectable ECC error, row remap pending or failed, or time fallen off the bus "
        f"(read every {rec.INTERVAL}).",
        findings=[f"{len(problems)} GPUs had a health problem in the period, of at most "
                  f"{installed[0].values[-1][1]:,.0f} installed."],
        tables=[Table("GPUs with health problems", ("Cluster", "Node", "GPU", "Model", "XIDs (code ×count)",
                                                    "Uncorrectable ECC", "Row remap", "Hours lost"), rows),
                Table("Nodes where NVML missed GPUs on the PCI bus", ("Cluster", "Node", "Most GPUs missing"),
                      sorted(nodes)),
                Table("GPUs with health problems by cluster and model", ("Cluster", "Model", "GPUs"),
                      [(*k, str(v)) for k, v in sorted(per_model.items())])])


async def stragglers(q: Queries) -> Section:
    w = q.window
    slow, worst = await asyncio.gather(q.at_end(f"count_over_time({w.over(rec.STRAGGLING)})"),
                                       q.at_end(f"min_over_time({rec.STRAGGLING}[{w.r}])"))
    names = ("cluster", "scheduler", "job_id", "instance")
    lowest = _by_labels(worst, names)
    rows = []
    for s in sorted(slow, key=lambda s: (-s.values[-1][1], _ident(s, names))):
        ident = _ident(s, names)
        rows.append((_cluster(s.labels), s.labels.get("instance", ""), f"{ident[1]} {ident[2]}",
                     _hours(s.values[-1][1] * w.hours_per_point), _pct(lowest.get(ident))))
    return Section("stragglers", "Nodes that straggled",
                   f"A node straggles while its mean SM clock is below {q.config.straggler_relative:.0%} of the "
                   "median node's in the same job (jobs of two nodes or more), judged at every step of the range.",
                   findings=[f"Nodes that straggled in the period: {len({(r[0], r[1]) for r in rows})}."],
                   tables=[Table("Straggling nodes", ("Cluster", "Node", "Job", "Hours straggling",
                                                      "Lowest clock against the median node"), rows[:TOP * 5])])


async def network(q: Queries) -> Section:
    w = q.window
    peak, p95 = await asyncio.gather(q.at_end(f"max_over_time({rec.LINKS}[{w.r}])"),
                                     q.at_end(f"quantile_over_time(0.95, {rec.LINKS}[{w.r}])"))
    if not peak:
        raise SectionError("no link throughput in the range")

    names = ("cluster", "instance", "device", "port", "direction")
    peaks = _by_labels(peak, names)
    ranked = sorted(((s.values[-1][1], _ident(s, names)) for s in p95), reverse=True)
    saturated = q.config.saturation_warning
    busy = sum(1 for value, _ in ranked if value >= saturated)
    rows = [(_cluster({"cluster": i[0]}), i[1], f"{i[2]}/{i[3]}" if i[3] else i[2],
             "InfiniBand" if i[3] else "Ethernet", i[4], _pct(value), _pct(peaks.get(i)))
            for value, i in ranked[:TOP]]
    return Section("network", "Network links",
                   f"Link throughput against link speed, averaged over {rec.WINDOW} every {rec.INTERVAL}; the busiest "
                   f"{TOP} links by p95.",
                   findings=[f"{busy} of {len(ranked)} link directions spent 5% or more of the period at "
                             f"{saturated:.0%} of line rate or above."],
                   tables=[Table("Busiest links", ("Cluster", "Node", "Port", "Kind", "Direction", "p95", "Peak"),
                                 rows)])


async def jobs(q: Queries) -> Section:
    w = q.window
    top, used, widest, spread = await asyncio.gather(
        q.at_end(f"topk({TOP}, {_summed(w, rec.JOB_GPUS)})"), q.at_end(_summed(w, rec.JOB_USED)),
        q.at_end(f"max_over_time({rec.JOB_GPUS}[{w.r}])"), q.at_end(f"max_over_time({rec.JOB_NODES}[{w.r}])"))
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
    used = f'label_replace(sum by ({q.by()}) ({rec.USED}), "state", "used", "", "")'
    result = await q.over_range(f"sum by ({q.by('state')}) ({rec.GPUS}) or {used}", step)
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


def _method(window: Window, config: Config) -> list[str]:
    return [f"Figures over the range are sampled every {window.step // 60} minutes (a Prometheus subquery at that "
            f"step) from the series that the {rec.GROUP.format('*')} rules record every {spoken(rec.INTERVAL)}; "
            "GPU-hours are samples times the step.",
            "A GPU is allocated while gpufleet_gpu_job_info attributes a job to it, idle while it is healthy and "
            "has none, and lost while gpufleet_gpu_up is 0.",
            cluster_note(config)]


SECTIONS = (
    SectionSpec("inventory", "Inventory", (rec.GPUS,), inventory),
    SectionSpec("allocation", "Allocated and idle GPU-hours", (rec.GPUS,), allocation),
    SectionSpec("utilisation", "Utilisation of allocated GPUs", (rec.ALLOCATED_BUCKETS, rec.USED), utilisation),
    SectionSpec("memory", "Memory headroom", (rec.GPUS, rec.MEMORY_TOTAL), memory),
    SectionSpec("energy", "Energy and power", (rec.POWER_GPUS,), energy),
    # The health and straggler series exist only while something is wrong: their absence is good news,
    # as long as the group that records them is loaded (its GPU counts are there).
    SectionSpec("health", "GPUs with health problems", (rec.GPUS,), health),
    SectionSpec("stragglers", "Nodes that straggled", (rec.GPUS, rec.JOB_NODES), stragglers),
    SectionSpec("network", "Network links", (rec.LINKS,), network),
    SectionSpec("jobs", "Top jobs by GPU-hours", (rec.JOB_GPUS,), jobs),
    SectionSpec("trend", "Trend and projection", (rec.GPUS, rec.USED), trend),
)
CAPACITY = ReportSpec("capacity", "GPU fleet capacity report", SECTIONS, _method)
