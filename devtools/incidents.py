"""The end-to-end fault kinds as a round of the detection sweep: one of each on a node of its own, and how many
pager incidents each opens at production timing, with how long it took to page.

An incident is PagerDuty's: a dedup key (Alertmanager's group) from its first trigger to its resolve, as
`delivery.Receiver` keeps them, at an Alertmanager whose timers are divided like the rules'. A fault that
should page must open exactly one; one that should not (it needs a ticket or nothing) none; and an incident
on a node with no fault is a false page.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.devtools.delivery import Receiver
from gpufleet.devtools.net import http
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import HarnessError

# Each kind as the round injects it, and whether it should page (otherwise it tickets, or only informs).
KINDS: tuple[tuple[dict[str, Any], bool], ...] = (
    ({"kind": "xid", "gpu": 0, "xid": 79}, True),
    ({"kind": "ecc_dbe", "gpu": 1}, True),
    ({"kind": "gpu_lost", "gpu": 5}, True),
    ({"kind": "ib_link_down", "port": "mlx5_4/1"}, True),
    ({"kind": "row_remap_failure", "gpu": 0}, False),
    ({"kind": "nvlink_down", "gpu": 2, "link": 3}, True),
    ({"kind": "ib_link_flap", "port": "mlx5_5/1"}, True),
    ({"kind": "ib_rate_degraded", "port": "mlx5_6/1"}, False),
    ({"kind": "exporter_down"}, True),
    ({"kind": "thermal_slowdown", "gpu": 1}, False),
    ({"kind": "power_brake", "gpu": 0}, False),
    ({"kind": "pcie_replay_storm", "gpu": 3}, False),
    ({"kind": "symbol_errors", "port": "mlx5_3/1"}, False),
    ({"kind": "nic_saturation", "port": "mlx5_1/1", "direction": "tx"}, False),
    ({"kind": "fabric_not_ready", "gpu": 6}, True),
    ({"kind": "fabric_degraded", "gpu": 2}, False),
    ({"kind": "job_hang"}, True),  # Pages once for the job the node runs, not for the node (`Injected.job`).
    ({"kind": "power_capped", "gpu": 4}, False),
    ({"kind": "ecc_disabled", "gpu": 5}, False),
    ({"kind": "persistence_off", "gpu": 6}, False),
    ({"kind": "driver_mismatch", "duration": "2s"}, False),  # A reboot of 16 production seconds, into the old driver.
    ({"kind": "kernel_events", "event": "hung_task", "rate": 0.1}, False),
    # The driver hangs: one page on a busy node; an idle node's is the collector's ticket (detection's round).
    ({"kind": "driver_hang"}, True),
    # A GPU off the bus for good, and a reboot halfway through the round that does not bring it back (REPAIRS):
    # its page stays open through the reboot, as one incident.
    ({"kind": "gpu_dead", "gpu": 5}, True),
    # Contained: only the job that touched the memory died, and the reset waits for the next drain (a ticket).
    ({"kind": "ecc_contained", "gpu": 3}, False),
    # A bad PCIe link: its uncorrectable error and its corrections are tickets.
    ({"kind": "pcie_aer", "gpu": 1}, False),
    # An NVSwitch's fatal error holds every GPU of the board at a reset: one page for the busy node, as a GPU's
    # reset is; non-fatal ones that repeat are a ticket.
    ({"kind": "sxid_fatal"}, True),
    ({"kind": "sxid_nonfatal", "rate": 0.1}, False),
)
# What an operator does on a kind's node while it lasts: a fault, and when, as a share of the round.
REPAIRS: dict[str, tuple[dict[str, Any], float]] = {"gpu_dead": ({"kind": "node_reboot", "duration": "2s"}, 0.5)}


@dataclass
class Injected:
    """One fault of the round, and what the pager made of it."""

    fault: dict[str, Any]
    pages: bool  # Whether it should page.
    node: str
    start: float = 0.0  # Monotonic seconds.
    end: float = 0.0
    incidents: int = 0
    paged: float | None = None  # Production minutes from its start to its first page.
    job: str = ""  # A job_hang's: the id of the job its node ran, whose JobHung pages are its.

    @property
    def kind(self) -> str:
        return str(self.fault["kind"])

    def caused(self, alert: dict[str, str]) -> bool:
        """Whether an alert (its labels) is this fault's: on its node, its job's hang, or the mixed versions a
        node with another driver makes in its job and its model's fleet."""
        if self.job and alert.get("alertname") == "JobHung":
            return alert.get("job_id") == self.job
        if self.kind == "driver_mismatch" and alert.get("alertname") in ("JobVersionsMixed", "NodeVersionsMixed"):
            return True
        return alert.get("instance") == self.node

    @property
    def right(self) -> bool:
        return self.incidents == (1 if self.pages else 0)


def apart(kinds: int, pool: list[str], jobs: Sequence[Sequence[str]]) -> list[str]:
    """A node for each of the first `kinds` kinds, taken from the end of `pool` (and out of it). A hang takes the
    first node of the smallest of `jobs` wholly in the pool, and its job's other nodes leave the pool with it: a
    fault on a node of the hung job would page for that node, the hang would stand aside for it (alerts/jobs.py),
    and the round would never see the hang's own page. Without such a job the hang is drawn like the others."""
    names = [str(body["kind"]) for body, _ in KINDS[:kinds]]
    free = [job for job in jobs if job and set(job) <= set(pool)]
    hung = min(free, key=len) if "job_hang" in names and free else ()
    for node in hung:
        pool.remove(node)
    if kinds - bool(hung) > len(pool):
        raise HarnessError(f"{kinds} fault kinds need as many nodes; {len(pool) + bool(hung)} are free")
    chosen = [pool.pop() for _ in range(kinds - bool(hung))]
    if hung:
        chosen.insert(names.index("job_hang"), hung[0])
    return chosen


def inject(sim_url: str, nodes: list[str], kinds: int, seconds: float, seed: int, now: float,
           jobs: Sequence[Sequence[str]] = ()) -> list[Injected]:
    """The first `kinds` kinds, each on a node drawn from `nodes` (a hang on a job of `jobs` of its own, `apart`),
    lasting `seconds` (wall) unless the kind says."""
    pool = list(nodes)
    random.Random(f"incidents:{seed}").shuffle(pool)
    chosen = apart(kinds, pool, jobs)
    round_ = [Injected(fault, pages, node) for (fault, pages), node in zip(KINDS[:kinds], chosen, strict=True)]
    for fault in round_:
        faults = [{"duration": seconds, **fault.fault, "node": fault.node}]
        if fault.kind in REPAIRS:
            repair, share = REPAIRS[fault.kind]
            faults.append({**repair, "node": fault.node, "start": f"+{round(share * seconds * 1000)}ms"})
        for body in faults:
            status, answer = http("POST", f"{sim_url}/control/faults", body)
            if status != 201:
                raise HarnessError(f"the simulator refused {body}: {status} {answer!r}")
        fault.start, fault.end = now, now + seconds
    return round_


def running_job(prom_url: str, node: str) -> str:
    """The id of a job `node` runs, as Prometheus sees it: the job a hang there stops; "" for an idle node, whose
    hang pages nobody."""
    found = query(prom_url, f'group by (job_id) (gpufleet_gpu_job_info{{instance="{node}",job_id!=""}})')
    return str(found[0]["metric"]["job_id"]) if found else ""


def hang_at_stake(prom_url: str, fault: Injected) -> str:
    """For a job's hang, the job it stops (`fault.job`: the one its node runs), and on a node that runs none,
    that nothing should page, said. A hung driver always should: on a node with work it pages at once, and on an
    idle one its recovery action pages after `drain_grace`, as no bench drains the node. "" otherwise."""
    if fault.kind != "job_hang":
        return ""
    fault.job = running_job(prom_url, fault.node)
    if fault.job:
        return ""
    fault.pages = False
    return f"job_hang on {fault.node}: the node runs no job, so nothing should page"


def count(round_: list[Injected], receiver: Receiver, scale: float,
          also: Callable[[dict[str, str], float], bool] = lambda alert, at: False) -> list[str]:
    """Fill in each fault's incidents and time to page; returns the incidents that neither a fault of the round
    nor `also` (an alert's labels and when it paged: another fault the run injected) explains, the false pages,
    by the alerts they listed."""
    incidents = receiver.incidents()
    explained = {number for number, (_, pages) in enumerate(incidents)
                 if any(also(alert, page.at) for page in pages for alert in page.alerts)}
    for fault in round_:
        mine = [(number, pages) for number, (_, pages) in enumerate(incidents)
                if number not in explained and pages[-1].at >= fault.start
                and any(fault.caused(alert) for page in pages for alert in page.alerts)]
        fault.incidents = len(mine)
        explained.update(number for number, _ in mine)
        if mine:
            fault.paged = (min(pages[0].at for _, pages in mine) - fault.start) * scale / 60
    return [", ".join(sorted({f"{alert.get('alertname')} on {alert.get('instance', '')}"
                              for page in pages for alert in page.alerts}))
            for number, (_, pages) in enumerate(incidents) if number not in explained]


def table(round_: list[Injected], false_pages: list[str]) -> str:
    """The round as the bench prints it."""
    lines = ["Fault kinds: pager incidents per fault at production timing", "",
             "| kind | node | should page | incidents | time to page (min) |", "|---|---|---|---|---|"]
    lines += [f"| {f.kind} | {f.node} | {'yes' if f.pages else 'no'} | {f.incidents} | "
              + (f"{f.paged:.1f} |" if f.paged is not None else "- |") for f in round_]
    right = sum(f.right for f in round_)
    lines += ["", f"Faults whose incidents are as they should be: {right}/{len(round_)}; "
                  f"most incidents for one fault: {max((f.incidents for f in round_), default=0)}; "
                  f"false pages: {len(false_pages)}."]
    lines += [f"  false page: {text}" for text in false_pages]
    return "\n".join(lines)
