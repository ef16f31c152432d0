"""The reliability report: how often the fleet interrupts jobs, why, where it repeats, and what that means
for a job of a given size, set against the published failure tables.

Every section reads what the `gpufleet-reliability` rule group records (alerts/reliability.py): one
series per interrupted GPU, port or node and cause, present only in the 10-minute interval where an
interruption starts, and the GPUs, ports and nodes observed per cluster. A month of a healthy fleet
is therefore almost nothing to read, and counts are sums of what is there.

Rates are per 1,000 GPU-days of observed GPUs (a node's or a port's interruptions are counted against
the GPUs as well, as the published tables do), with exact Poisson 95% intervals. The mean time to
interruption of a job of N GPUs assumes its share of interruptions is N times the fleet's rate per GPU.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

from gpufleet.alerts import capacity as cap
from gpufleet.alerts import history
from gpufleet.alerts import reliability as rec
from gpufleet.alerts.config import Config
from gpufleet.report import charts
from gpufleet.report.document import Section, Table
from gpufleet.report.figures import poisson_interval
from gpufleet.report.prometheus import Series
from gpufleet.report.query import Queries, Window
from gpufleet.report.spec import ReportSpec, SectionError, SectionSpec, cluster_note

EVENTS = (rec.GPU_EVENTS, rec.PORT_EVENTS, rec.NODE_EVENTS)
JOB_SIZES = (8, 64, 512, 1024, 4096, 16384, 131072)
TOP = 20
# Published points for the chart and table: (source, [(GPUs in the job, hours between interruptions)]).
LLAMA3 = ("Llama 3 pre-training (2024)", [(16384, 54 * 24 / 419)])  # 419 unexpected in 54 days.
META = ("Meta research clusters (2025)", [(8, 47 * 24.0), (1024, 7.9), (16384, 1.8)])
LLAMA3_PER_1000_GPU_DAYS = 419 / (16384 * 54) * 1000


def _per_thousand(count: float, gpu_days: float) -> str:
    return f"{1000 * count / gpu_days:.3f}" if gpu_days else "—"


def _interval(count: int, gpu_days: float) -> str:
    low, high = poisson_interval(count)
    return f"{1000 * low / gpu_days:.3f}–{1000 * high / gpu_days:.3f}" if gpu_days else "—"


def _by_cause(counts: Counter[str]) -> str:
    return ", ".join(f"{rec.CLASSES.get(k, k)} {v}" for k, v in counts.most_common())


def _hours(value: float) -> str:
    """A mean time in the unit that keeps it readable: days, hours, minutes or seconds."""
    for unit, hours, at_least in (("days", 24.0, 48.0), ("h", 1.0, 1.0), ("min", 1 / 60, 1 / 60)):
        if value >= at_least:
            return f"{value / hours:,.1f} {unit}"
    return f"{value * 3600:,.1f} s"


async def _exposure(q: Queries) -> dict[str, float]:
    """GPU-, port- and node-days observed over the range, from the group's own counts at every step."""
    w = q.window
    # The group records every 10 minutes, longer than Prometheus looks back for an instant: each step reads the
    # latest count within an interval.
    latest = f"last_over_time({rec.OBSERVED}[{rec.INTERVAL}])"
    result = await q.at_end(f"sum by (unit) (sum_over_time({w.over(latest)}))")
    days = {s.labels.get("unit", ""): s.values[-1][1] * w.step / 86400 for s in result}
    if not days.get("gpu"):
        raise SectionError(f"the {rec.GROUP} rules observed no GPU in the range")
    return days


async def _counts(q: Queries, by: str) -> list[Series]:
    """Interruptions per `by` over the range, from every level's event series."""
    results = await asyncio.gather(*(q.at_end(f"sum by ({by}) (sum_over_time({name}[{q.window.r}]))")
                                     for name in EVENTS))
    return [s for result in results for s in result]


def _per_class(per_cluster: list[Series]) -> Counter[str]:
    """Interruptions per class over all clusters, from the counts per cluster and class."""
    counts: Counter[str] = Counter()
    for s in per_cluster:
        counts[s.labels.get("class", "")] += round(s.values[-1][1])
    return counts


async def interruptions(q: Queries) -> Section:
    exposure, per_cluster = await asyncio.gather(_exposure(q), _counts(q, q.by("class")))
    gpu_days = exposure["gpu"]
    counts = _per_class(per_cluster)
    total = sum(counts.values())
    rows = [(title, str(counts[key]), _per_thousand(counts[key], gpu_days), _interval(counts[key], gpu_days),
             f"{100 * counts[key] / total:.1f}%" if total else "—")
            for key, title in rec.CLASSES.items()]
    rows.append(("All causes", str(total), _per_thousand(total, gpu_days), _interval(total, gpu_days),
                 "100%" if total else "—"))
    clusters: dict[str, Counter[str]] = defaultdict(Counter)
    for s in per_cluster:
        clusters[s.labels.get("cluster", "") or "—"][s.labels.get("class", "")] += round(s.values[-1][1])
    cluster_rows = [(name, str(sum(c.values())), _by_cause(c)) for name, c in sorted(clusters.items())]
    return Section(
        "interruptions", "Interruptions by cause",
        "Each interruption is the start of a fault on one GPU, InfiniBand port or node (the rule group's "
        "classes), counted once however long it lasts. Rates are per 1,000 GPU-days of GPUs observed, with exact "
        "Poisson 95% intervals.",
        findings=[f"{total} interruptions in {gpu_days:,.0f} GPU-days: {_per_thousand(total, gpu_days)} per 1,000 "
                  f"GPU-days (95%: {_interval(total, gpu_days)}). Llama 3's pre-training saw "
                  f"{LLAMA3_PER_1000_GPU_DAYS:.3f}."],
        tables=[Table("Interruptions by cause", ("Cause", "Interruptions", "Per 1,000 GPU-days", "95% interval",
                                                 "Share"), rows),
                Table("Interruptions by cluster", ("Cluster", "Interruptions", "By cause"), cluster_rows)])


async def xids(q: Queries) -> Section:
    result = await q.at_end(f'sum by (class, xid) (sum_over_time({rec.GPU_EVENTS}{{xid!=""}}[{q.window.r}]))')
    rows = sorted(((s.labels.get("xid", ""), rec.CLASSES.get(s.labels.get("class", ""), ""), round(s.values[-1][1]))
                   for s in result), key=lambda r: (-r[2], r[0]))
    return Section("xids", "XIDs behind GPU interruptions",
                   "The XID code of each GPU hardware and application interruption (memory XIDs count under GPU "
                   "memory, XID 79 under GPU lost, XID 74 under NVLink).",
                   tables=[Table("Interruptions by XID", ("XID", "Cause", "Interruptions"),
                                 [(x, c, str(n)) for x, c, n in rows])])


def _records(record: list[Series]) -> list[tuple[str, ...]]:
    """Each node's record (alerts/history.py) over the range, one row per node, the most faults first."""
    per_node: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for s in record:
        per_node[(s.labels.get("cluster", "") or "—", s.labels.get("instance", ""))][s.labels.get("event", "")] += \
            round(s.values[-1][1])
    ranked = sorted(per_node.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    return [(c, i, str(sum(n.values())), *(str(n[event]) for event in history.EVENT_KINDS)) for (c, i), n in ranked]


async def repeats(q: Queries) -> Section:
    gpus, nodes, record = await asyncio.gather(
        q.at_end(f"sum by ({q.by('instance', 'gpu', 'uuid')}) (sum_over_time({rec.GPU_EVENTS}[{q.window.r}])) >= 2"),
        _counts(q, q.by("instance")),
        q.at_end(f"sum by ({q.by('instance', 'event')}) (count_over_time({history.EVENTS}[{q.window.r}]))"))
    per_node: Counter[tuple[str, str]] = Counter()
    for s in nodes:
        per_node[(s.labels.get("cluster", "") or "—", s.labels.get("instance", ""))] += round(s.values[-1][1])
    node_rows = [(c, i, str(n)) for (c, i), n in per_node.most_common() if n >= 2]
    records = _records(record)
    gpu_rows = sorted(((s.labels.get("cluster", "") or "—", s.labels.get("instance", ""), s.labels.get("gpu", ""),
                        s.labels.get("uuid", ""), str(round(s.values[-1][1]))) for s in gpus),
                      key=lambda r: (-int(r[4]), r))
    return Section("repeats", "GPUs and nodes that repeat",
                   "Hardware interrupted twice or more in the period: candidates for a closer look, a burn-in "
                   "or a return, before they interrupt the next job. A node counts its GPUs' and ports' "
                   "interruptions as well as its own. Its record (the gpufleet-history rules) counts the "
                   "repairs, straggler episodes and link flaps that began outside maintenance, each once.",
                   findings=[f"{len(gpu_rows)} GPUs and {len(node_rows)} nodes were interrupted twice or more.",
                             f"{sum(int(r[2]) >= q.config.repeat_faults for r in records)} nodes had "
                             f"{q.config.repeat_faults} or more repairs, straggler episodes and link flaps, as "
                             "NodeRepeatedFaults counts them (outside maintenance)."],
                   tables=[Table("GPUs interrupted twice or more", ("Cluster", "Node", "GPU", "UUID", "Interruptions"),
                                 gpu_rows[:TOP]),
                           Table("Nodes interrupted twice or more", ("Cluster", "Node", "Interruptions"),
                                 node_rows[:TOP]),
                           Table("Nodes by their record", ("Cluster", "Node", "Faults", "Repairs",
                                                           "Straggler episodes", "Link flaps"), records[:TOP])])


async def jobs(q: Queries) -> Section:
    """The jobs on a node when one of its interruptions started: the samples give each start's time, and the
    jobs' attribution over the range, at the report's step, gives who was there just before."""
    w = q.window
    started = [s for result in await asyncio.gather(*(q.samples(name) for name in EVENTS)) for s in result]
    if not started:
        return Section("jobs", "Jobs hit", "No interruption started in the period.")
    instances = sorted({s.labels.get("instance", "") for s in started})
    hit_nodes = 'instance=~"' + "|".join(_literal(i) for i in instances) + '"'
    placed, hours = await asyncio.gather(
        q.over_range(f"group by ({q.by('instance', 'scheduler', 'job_id')}) "
                     f"({q.config.metric('gpufleet_gpu_job_info', hit_nodes)})", w.step),
        q.at_end(f"sum by ({q.by('scheduler', 'job_id')}) ({_gpu_hours(w)})"))
    present: dict[tuple[str, str], list[tuple[float, tuple[str, str]]]] = defaultdict(list)
    for s in placed:
        node = (s.labels.get("cluster", ""), s.labels.get("instance", ""))
        job = (s.labels.get("scheduler", ""), s.labels.get("job_id", ""))
        present[node].extend((t, job) for t, _ in s.values)
    hits: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    for s in started:
        node = (s.labels.get("cluster", ""), s.labels.get("instance", ""))
        for t, _ in s.values:
            for job in _jobs_before(present.get(node, []), t, w.step):
                hits[(node[0], *job)][s.labels.get("class", "")] += 1
    ran = {(s.labels.get("cluster", ""), s.labels.get("scheduler", ""), s.labels.get("job_id", "")):
           s.values[-1][1] * w.hours_per_point for s in hours}
    rows = sorted(((cluster or "—", f"{scheduler} {job}".strip(), sum(c.values()),
                    _by_cause(c), ran.get((cluster, scheduler, job)))
                   for (cluster, scheduler, job), c in hits.items()), key=lambda r: (-r[2], r[:2]))
    total = sum(sum(c.values()) for c in hits.values())
    gpu_hours = sum(r[4] or 0 for r in rows)
    return Section(
        "jobs", "Jobs hit",
        "A job is hit when an interruption starts on a node it was attributed to just before (gpufleet_gpu_job_info "
        f"at the report's {w.step // 60}-minute step). Job-hours hit are the GPU-hours those jobs ran in the period, "
        "from the capacity rules.",
        findings=[f"{len(rows)} {'job was' if len(rows) == 1 else 'jobs were'} hit {total} times; "
                  f"{'it' if len(rows) == 1 else 'they'} ran {gpu_hours:,.0f} GPU-hours in the period."],
        tables=[Table("Jobs hit", ("Cluster", "Job", "Interruptions", "By cause", "GPU-hours in the period"),
                      [(c, j, str(n), by, f"{h:,.0f}" if h is not None else "—") for c, j, n, by, h in rows[:TOP]])])


def _literal(text: str) -> str:
    """`text` as a regular expression matching only itself, written for a double-quoted PromQL string (whose
    own escapes take one backslash away)."""
    return "".join("\\\\" + ch if ch in ".^$*+?()[]{}|\\" else ch for ch in text)


def _gpu_hours(w: Window) -> str:
    return f"sum_over_time({w.over(cap.JOB_GPUS)})"


def _jobs_before(placed: list[tuple[float, tuple[str, str]]], t: float, step: int) -> set[tuple[str, str]]:
    """Jobs on the node at the last step at or before `t`, or the step before that: a node down at `t`
    reports no job, so the one it ran just before is the one hit."""
    steps = [p for p in placed if t - 2 * step <= p[0] <= t]
    latest = max((p[0] for p in steps), default=None)
    return {job for at, job in steps if at == latest}


async def mtti(q: Queries) -> Section:
    exposure, per_cluster = await asyncio.gather(_exposure(q), _counts(q, q.by("class")))
    total = sum(_per_class(per_cluster).values())
    gpu_hours = exposure["gpu"] * 24
    low, high = poisson_interval(total)
    rate, rate_low, rate_high = total / gpu_hours, low / gpu_hours, high / gpu_hours
    hours = [1 / (n * rate) if rate else None for n in JOB_SIZES]
    longest = [1 / (n * rate_low) if rate_low else None for n in JOB_SIZES]
    shortest = [1 / (n * rate_high) for n in JOB_SIZES]
    published = {n: [f"{name}: {_hours(h)}" for name, points in (META, LLAMA3) for size, h in points if size == n]
                 for n in JOB_SIZES}
    rows = [(f"{n:,}", _hours(h) if h is not None else "no interruption seen",
             f"{_hours(lo)}–{_hours(hi)}" if hi is not None else f"at least {_hours(lo)}",
             "; ".join(published[n]) or "") for n, h, lo, hi in zip(JOB_SIZES, hours, shortest, longest, strict=True)]
    return Section(
        "mtti", "Mean time to interruption by job size",
        "Hours between interruptions for a job spread over N GPUs, if it meets the fleet's interruptions in "
        "proportion to its GPUs (so half of it at twice the rate: a straight line on log axes), with the published "
        "figures of Meta's research clusters (Kokolis et al., 2025) and Llama 3's pre-training beside it.",
        findings=[f"At this fleet's rate a 16,384-GPU job would be interrupted every "
                  f"{_hours(1 / (16384 * rate)) if rate else 'at least ' + _hours(1 / (16384 * rate_high))}; "
                  f"Llama 3's was every {_hours(LLAMA3[1][0][1])}."],
        tables=[Table("Mean time to interruption", ("GPUs in the job", "Mean time", "95% interval", "Published"),
                      rows)],
        charts=[charts.mtti(JOB_SIZES, hours, shortest, longest, [META, LLAMA3])])


def _method(window: Window, config: Config) -> list[str]:
    return [f"Interruptions are recorded by the {rec.GROUP} rules every {rec.INTERVAL}: one series per "
            "GPU, InfiniBand port or node and cause, in the interval where an interruption starts. Counts are sums "
            "over the range; exposure is the GPUs those rules observed at every "
            f"{window.step // 60}-minute step.",
            "Intervals are exact (Garwood) Poisson intervals on the count; the observed GPU-days are taken as known.",
            "Causes the node's metrics cannot see (NCCL timeouts, silent data corruption, a software bug that "
            "raises no XID) are not counted: compare with a published table only for the causes both count.",
            cluster_note(config)]


SECTIONS = (
    SectionSpec("interruptions", "Interruptions by cause", (rec.OBSERVED,), interruptions),
    SectionSpec("xids", "XIDs behind GPU interruptions", (rec.OBSERVED,), xids),
    SectionSpec("repeats", "GPUs and nodes that repeat", (rec.OBSERVED,), repeats),
    SectionSpec("jobs", "Jobs hit", (rec.OBSERVED, "gpufleet_gpu_job_info", cap.JOB_GPUS), jobs),
    SectionSpec("mtti", "Mean time to interruption by job size", (rec.OBSERVED,), mtti),
)
RELIABILITY = ReportSpec("reliability", "GPU fleet reliability report", SECTIONS, _method)
