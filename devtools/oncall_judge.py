"""What an on-call week brought its people: each pager incident and ticket put down to the real fault that explains
it, or else to the planned work under way on its node, its leaf or the whole fleet, and the week's figures against
the targets of its issue (no page from planned work, at most one incident per fault, none that resolved while its
fault held, no fault that reached nobody, and each kind paged within what the detection bench last found, plus
one evaluation interval: `allowed`).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import TREND_INTERVAL
from gpufleet.devtools.delivery import Receiver
from gpufleet.devtools.oncall import Fault, Week, Work
from gpufleet.devtools.oncall_run import Running
from gpufleet.devtools.results import RESULTS

GRACE = 15.0  # Production minutes after planned work in which what it left behind is still its own.
EVALUATION = duration.parse(TREND_INTERVAL) / 60  # Production minutes.
DRAIN_GRACE = duration.parse(Config().drain_grace) / 60
SHIFT_HOURS = 12


@dataclass
class Incident:
    """A pager incident: its dedup key, when it opened and resolved (monotonic seconds), every alert it listed."""

    key: str
    opened: float
    resolved: float | None
    alerts: list[dict[str, str]]

    def names(self, running: Running) -> str:
        """Its alerts, and when it opened in production minutes."""
        alerts = ", ".join(sorted({f"{a.get('alertname')} on {_where(a)}" for a in self.alerts}))
        return f"{alerts}, at {running.minutes(self.opened):.1f} min"


def _where(labels: dict[str, str]) -> str | None:
    """What an alert is about: its node, leaf, job or cluster."""
    return labels.get("instance") or labels.get("leaf") or labels.get("job_id") or labels.get("cluster")


def _detail(labels: dict[str, str]) -> str:
    """The labels that tell one alert of a node from another (a job, a signal, a GPU, a port), so that a ticket
    nothing explains can be traced to the series behind it."""
    shared = {"alertname", "alertstate", "cluster", "instance", "severity", "scheduler", "job"}
    rest = [f"{name}={value}" for name, value in sorted(labels.items()) if name not in shared]
    return f" ({', '.join(rest)})" if rest else ""


@dataclass
class Verdict:
    """One real fault and what reached people for it: its incidents, its tickets (alert episodes), how many
    production minutes it took to page (from its start, or from its node's return to service) and how many it
    was allowed (`allowed`), and how many of its incidents resolved while it held."""

    fault: Fault
    incidents: list[Incident] = field(default_factory=list)
    tickets: int = 0
    paged: float | None = None
    allowed: float | None = None
    resolved_early: int = 0

    @property
    def reached(self) -> bool:
        return bool(self.incidents or self.tickets)


@dataclass
class Judged:
    verdicts: list[Verdict]
    planned_pages: list[tuple[str, Incident]]
    other_pages: list[Incident]
    tickets: Counter[str]
    planned_tickets: list[str]
    other_tickets: list[str]
    pages: int
    shift_pages: list[int]


def incidents(receiver: Receiver) -> list[Incident]:
    found = []
    for key, pages in receiver.incidents():
        triggers = [page for page in pages if page.action == "trigger"]
        alerts = {tuple(sorted(alert.items())): alert for page in triggers for alert in page.alerts}
        resolved = pages[-1].at if pages[-1].action == "resolve" else None
        found.append(Incident(key, triggers[0].at, resolved, list(alerts.values())))
    return found


def _fault_of(alerts: list[dict[str, str]], at: float, faults: list[Fault], running: Running) -> Fault | None:
    """The real fault that explains what reached people at `at`: one of its own alerts, raised after it began
    (and, on a node in maintenance, after the node returned)."""
    for fault in sorted(faults, key=lambda f: f.injected.start):
        begun = running.at(fault.returns) if fault.returns is not None else fault.injected.start
        if at >= begun and any(fault.injected.caused(alert) for alert in alerts):
            return fault
    return None


def _work_of(alerts: list[dict[str, str]], at: float, works: list[Work], running: Running) -> Work | None:
    """The planned work that explains what reached people at `at`: work whose own alerts these are, work on their
    node or leaf under way then, or else work on the whole fleet under way then."""
    for work in works:
        if at >= running.at(work.begin) and any(alert.get("alertname") in work.claims for alert in alerts):
            return work
    under_way = [work for work in works if running.at(work.begin) <= at <= running.at(work.finish + GRACE)]
    for work in under_way:
        if any(alert.get("instance") in work.nodes or (work.leaf and alert.get("leaf") == work.leaf)
               for alert in alerts):
            return work
    return next((work for work in under_way if work.fleet), None)


def judge(faults: list[Fault], works: list[Work], running: Running, receiver: Receiver, ended: float) -> Judged:
    verdicts = {id(fault): Verdict(fault) for fault in faults}
    planned_pages, other_pages = [], []
    every = incidents(receiver)
    for incident in every:
        fault = _fault_of(incident.alerts, incident.opened, faults, running)
        if fault is not None:
            verdict = verdicts[id(fault)]
            verdict.incidents.append(incident)
            if incident.resolved is not None and incident.resolved < min(fault.injected.end, ended):
                verdict.resolved_early += 1
            continue
        work = _work_of(incident.alerts, incident.opened, works, running)
        if work is not None:
            planned_pages.append((work.name, incident))
        else:
            other_pages.append(incident)
    tickets: Counter[str] = Counter()
    planned_tickets: list[str] = []
    other_tickets: list[str] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for at, path, labels in receiver.arrivals():
        key = tuple(sorted(labels.items()))
        if path != "ticket" or key in seen:
            continue
        seen.add(key)
        fault = _fault_of([labels], at, faults, running)
        if fault is not None:
            verdicts[id(fault)].tickets += 1
            tickets["faults"] += 1
            continue
        what = f"{labels.get('alertname')} on {_where(labels)}{_detail(labels)} at {running.minutes(at):.1f} min"
        if (work := _work_of([labels], at, works, running)) is not None:
            tickets["planned work"] += 1
            planned_tickets.append(f"{what} ({work.name})")
        else:
            tickets["other"] += 1
            other_tickets.append(what)
    reference = detection_times()
    for verdict in verdicts.values():
        if verdict.incidents:
            begun = verdict.fault.returns if verdict.fault.returns is not None else verdict.fault.at
            verdict.paged = running.minutes(min(incident.opened for incident in verdict.incidents)) - begun
            verdict.allowed = allowed(verdict, reference)
    shifts = [0] * max(1, -(-int(running.week.times.hours) // SHIFT_HOURS))
    for incident in every:
        hour = running.minutes(incident.opened) / 60
        shifts[min(len(shifts) - 1, int(hour // SHIFT_HOURS))] += 1
    return Judged(list(verdicts.values()), planned_pages, other_pages, tickets, planned_tickets, other_tickets,
                  len(every), shifts)


def detection_times() -> dict[str, float]:
    """Each fault kind's time to page in the detection bench's last recorded round of fault kinds, production
    minutes (a sweep of stragglers alone records the table empty)."""
    path = RESULTS / "detection_bench.json"
    if not path.exists():
        return {}
    for run in reversed(json.loads(path.read_text())["runs"]):
        table = run.get("tables", {}).get("pager incidents per fault kind")
        if table and table["rows"]:
            return {row[0]: row[3] for row in table["rows"] if row[3] is not None}
    return {}


def label(fault: Fault) -> str:
    body = fault.injected.fault
    return f"xid {body['xid']}" if body["kind"] == "xid" else str(body["kind"])


def allowed(verdict: Verdict, reference: dict[str, float]) -> float | None:
    """How long the fault may take to page, production minutes: its kind's time in the detection bench's round,
    plus one evaluation interval of the one-minute groups the pager's alerts read (whose phase against a fault's
    start moves its page by up to that much from one run to the next), plus `drain_grace` where its node was idle
    and the page is a repair's: that page waits, by design, for a drain that the week's dry-run remediator never
    makes (the round's nodes all have work). None for a kind the round did not page."""
    kind = str(verdict.fault.injected.fault["kind"])
    if kind not in reference:
        return None
    repair = any(alert.get("alertname") == "GpuRepairUrgent" for incident in verdict.incidents
                 for alert in incident.alerts)
    return reference[kind] + EVALUATION + (DRAIN_GRACE if verdict.fault.idle and repair else 0.0)


def late(judged: Judged) -> list[str]:
    """The faults that paged later than they were allowed."""
    return [f"{label(v.fault)} on {v.fault.injected.node}: {v.paged:.1f} min, {v.allowed:.1f} allowed"
            for v in judged.verdicts if v.paged is not None and v.allowed is not None and v.paged > v.allowed]


def figures(judged: Judged, week: Week) -> dict[str, float | int | None]:
    must_page = [v for v in judged.verdicts if v.fault.expect == "page"]
    return {
        "nodes": week.nodes, "production hours": week.times.hours, "real faults": len(judged.verdicts),
        "pages": judged.pages, "pages caused by planned work": len(judged.planned_pages),
        "other false pages": len(judged.other_pages),
        "most incidents for one fault": max((len(v.incidents) for v in judged.verdicts), default=0),
        "pages resolved while their fault held": sum(v.resolved_early for v in judged.verdicts),
        "faults that reached no receiver": sum(not v.reached for v in judged.verdicts
                                               if v.fault.expect in ("page", "ticket")),
        "faults that should page and did not": sum(not v.incidents for v in must_page),
        "faults that paged and should not": sum(bool(v.incidents) for v in judged.verdicts if v.fault.expect != "page"),
        "faults paged later than allowed": len(late(judged)),
        "tickets, faults": judged.tickets["faults"], "tickets, planned work": judged.tickets["planned work"],
        "tickets, other": judged.tickets["other"],
        "most pages in a 12-hour shift of the timeline": max(judged.shift_pages, default=0),
        "pages per 12-hour shift, the week's spread over its shifts": (
            round(judged.pages / (2 * week.days), 2) if week.days else None),
    }


def report(judged: Judged, running: Running) -> str:
    week = running.week
    lines = ["| fault | node | cause | expected | incidents | tickets | time to page (min) | allowed (min) | "
             "resolved while held |", "|---|---|---|---|---|---|---|---|---|"]
    for v in sorted(judged.verdicts, key=lambda v: v.fault.at):
        lines.append(f"| {label(v.fault)} | {v.fault.injected.node} | {v.fault.cause} | {v.fault.expect} | "
                     f"{len(v.incidents)} | {v.tickets} | {'-' if v.paged is None else f'{v.paged:.1f}'} | "
                     f"{'-' if v.allowed is None else f'{v.allowed:.1f}'} | {v.resolved_early} |")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for v in judged.verdicts:
        if v.paged is not None:
            by_kind[label(v.fault)].append(v.paged)
    lines += ["", "| kind | pages | time to page p50 / max (min) |", "|---|---|---|"]
    lines += [f"| {kind} | {len(times)} | {statistics.median(times):.1f} / {max(times):.1f} |"
              for kind, times in sorted(by_kind.items())]
    numbers = figures(judged, week)
    lines += ["", *(f"{name}: {value}" for name, value in numbers.items())]
    lines += [f"  page caused by planned work ({work}): {incident.names(running)}"
              for work, incident in judged.planned_pages]
    lines += [f"  other false page: {incident.names(running)}" for incident in judged.other_pages]
    lines += [f"  paged late: {text}" for text in late(judged)]
    lines += [f"  reached nobody: {label(v.fault)} on {v.fault.injected.node}" for v in judged.verdicts
              if not v.reached and v.fault.expect in ("page", "ticket")]
    for v in judged.verdicts:
        if len(v.incidents) > 1 or v.resolved_early:
            lines += [f"  {label(v.fault)} on {v.fault.injected.node}, incident: {incident.names(running)}, "
                      + ("open at the end" if incident.resolved is None else
                         f"resolved at {running.minutes(incident.resolved):.1f} min")
                      for incident in v.incidents]
    lines.append(running.health.line())
    lines += [f"  ticket from planned work: {text}" for text in judged.planned_tickets]
    lines += [f"  ticket neither a fault nor planned work explains: {text}" for text in judged.other_tickets]
    return "\n".join(lines)
