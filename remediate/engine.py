"""The remediator: alerts in, Slurm drains and resumes out, judged again from its state at every step.

It is level-triggered, as a controller: a webhook only records which alerts fire for which node, and `step()`
then moves each node towards what its alerts ask (drained while any fires; checked and resumed once none does).
A repeated webhook changes nothing, a late one for an older episode of an alert is ignored, and an action that
failed because Slurm did not answer is simply tried again at a later step, with backoff, until it is done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.remediate.check import Check
from gpufleet.remediate.slurm import REASON_PREFIX, Node, Slurm, SlurmError, SlurmUnavailable, UnknownNode
from gpufleet.remediate.state import NodeRecord, StateFile
from gpufleet.remediate.webhook import Alert

log = logging.getLogger(__name__)

_OUT_OF_SERVICE = frozenset({"DRAIN", "DOWN", "MAINTENANCE"})  # Slurm's flags of a node it places nothing on.


@dataclass(frozen=True)
class Settings:
    dry_run: bool = True
    max_nodes: int = 4  # Drains by gpufleet in a sliding hour, past which the breaker opens.
    max_share: float = 0.1  # Of any one partition of the node, in the same hour.
    retry_min: float = 1.0
    retry_max: float = 300.0


class Remediator:
    def __init__(self, slurm: Slurm, settings: Settings, check: Check | None = None,
                 state: StateFile | None = None, audit: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.slurm, self.settings, self.check, self.clock = slurm, settings, check, clock
        self.files = state or StateFile(None)
        self.state = self.files.load()
        self.audit_path = audit
        self.actions: Counter[tuple[str, str]] = Counter()
        self.slurm_errors = 0
        self.slurm_up = True
        self.known: dict[str, Node] = {}  # Slurm's nodes, as last listed.
        self.wake = asyncio.Event()
        self._checks: dict[str, asyncio.Task[None]] = {}

    # The webhook's side: record, never act.
    def receive(self, alerts: Iterable[Alert]) -> None:
        for alert in alerts:
            seen = self.state.alerts.get(alert.fingerprint)
            if seen is not None and (alert.starts_at < seen[0] or (alert.starts_at == seen[0] and seen[1])):
                continue  # An older episode, or the firing of one that has already resolved: out of order.
            self.state.alerts[alert.fingerprint] = (alert.starts_at, not alert.firing)
            record = self.state.nodes.get(alert.node)
            if alert.firing:
                if record is None:
                    record = self.state.nodes[alert.node] = NodeRecord(since=self.clock())
                if alert.fingerprint not in record.alerts:
                    self._audit("alert", alert.node, "firing", alert=alert)
                record.alerts[alert.fingerprint] = alert.reason
            elif record is not None and record.alerts.pop(alert.fingerprint, None) is not None:
                self._audit("alert", alert.node, "resolved", alert=alert)
        self._forget_old_alerts()
        self.files.save(self.state)
        self.wake.set()

    def _forget_old_alerts(self) -> None:
        """Resolved episodes older than a day: a webhook later than that is no longer a retry."""
        old = self.clock() - 86400
        self.state.alerts = {k: v for k, v in self.state.alerts.items() if not (v[1] and v[0] < old)}

    # The acting side.
    async def step(self) -> None:
        """One pass over the nodes: each one due moves one action towards what its alerts ask."""
        now = self.clock()
        for name, record in list(self.state.nodes.items()):
            if record.retry_at > now or name in self._checks:
                continue
            try:
                await self._advance(name, record)
                record.attempts, record.retry_at = 0, 0.0
                self.slurm_up = True
            except SlurmUnavailable as err:
                self._later(name, record, err)
            self.files.save(self.state)  # After each node's action: a drain done is on disk before the next.

    def _later(self, name: str, record: NodeRecord, err: SlurmUnavailable) -> None:
        """The node's action again after a backoff that doubles with each failure."""
        self.slurm_up = False
        self.slurm_errors += 1
        record.attempts += 1
        delay = min(self.settings.retry_max, self.settings.retry_min * 2 ** (record.attempts - 1))
        record.retry_at, record.why = self.clock() + delay, str(err)
        log.warning("slurm: %s; node %s tried again in %.0fs (attempt %d)", err, name, delay, record.attempts)

    async def _advance(self, name: str, record: NodeRecord) -> None:
        if record.alerts and record.phase == "wanted":
            await self._drain(name, record)
        elif not record.alerts and record.phase == "drained":
            self._checks[name] = asyncio.create_task(self._check_and_resume(name, record))
        elif not record.alerts and record.phase in ("wanted", "operator"):
            del self.state.nodes[name]  # Nothing gpufleet did to undo.
        elif record.phase in ("drained", "failed") and not self.settings.dry_run:
            node = await self.slurm.node(name)
            if not node.ours:  # An operator resumed it, or drained it again for a reason of their own.
                self._release(name, record, f"Slurm state {'+'.join(sorted(node.states))} reason {node.reason!r}")

    def _release(self, name: str, record: NodeRecord, why: str) -> None:
        """Let an operator's node go. The alerts that are firing are done with: their repeats must not drain it
        again over the operator's decision; a new episode of them will."""
        for fingerprint in record.alerts:
            starts_at, _ = self.state.alerts.get(fingerprint, (0.0, False))
            self.state.alerts[fingerprint] = (starts_at, True)
        self._audit("release", name, "operator", why=why)
        del self.state.nodes[name]

    async def _drain(self, name: str, record: NodeRecord) -> None:
        reason = REASON_PREFIX + sorted(record.alerts.values())[0]
        try:
            node = await self.slurm.node(name)
        except UnknownNode as err:
            self._audit("drain", name, "unknown_node", why=str(err), level=logging.ERROR)
            del self.state.nodes[name]
            return
        if node.drained and not node.ours:
            record.phase = "operator"
            self._audit("drain", name, "operator_drained", why=f"drained by someone else: {node.reason!r}")
            return
        if node.ours:
            record.phase = "drained"
            self._audit("drain", name, "already", why=node.reason)
            return
        if self.state.breaker.open or self._trips(name, node):
            if record.why != self.state.breaker.why:  # Once per node while the breaker stays open.
                record.why = self.state.breaker.why
                self._audit("drain", name, "breaker", why=record.why, causes=record.alerts, level=logging.ERROR)
            return
        if not self.settings.dry_run:
            await self.slurm.drain(name, reason)
        self.state.drains.append((self.clock(), name, list(node.partitions)))
        record.phase = "drained"
        self._audit("drain", name, "dry_run" if self.settings.dry_run else "ok", why=reason, causes=record.alerts)

    def _trips(self, name: str, node: Node) -> bool:
        """Whether draining `node` would pass the breaker's limits; if so, the breaker opens (and stays open)."""
        recent = self.state.recent_drains(self.clock())
        why = ""
        if len(recent) + 1 > self.settings.max_nodes:
            why = f"{len(recent) + 1} drains within an hour would pass the limit of {self.settings.max_nodes}"
        for partition in node.partitions:
            size = sum(partition in other.partitions for other in self.known.values()) or 1
            drained = sum(partition in parts for _, _, parts in recent) + 1
            allowed = max(1, int(self.settings.max_share * size))  # One node of a small partition, at least.
            if not why and drained > allowed:
                why = (f"{drained} of partition {partition}'s {size} nodes drained within an hour would pass "
                       f"{self.settings.max_share:.0%} ({allowed})")
        if why:
            self.state.breaker.open, self.state.breaker.since = True, self.clock()
            self.state.breaker.why = f"{why} (node {name}); no more drains until an operator closes it"
            log.error("breaker open: %s", self.state.breaker.why)
        return bool(why)

    async def _check_and_resume(self, name: str, record: NodeRecord) -> None:
        try:
            await self._resume(name, record)
            record.attempts, record.retry_at = 0, 0.0
        except SlurmUnavailable as err:
            self._later(name, record, err)
        except SlurmError as err:
            self._audit("resume", name, "error", why=str(err), level=logging.ERROR)
        finally:
            self._checks.pop(name, None)
            self.files.save(self.state)

    async def _resume(self, name: str, record: NodeRecord) -> None:
        if self.settings.dry_run:
            self._audit("resume", name, "dry_run", why="every alert resolved; would run the check and resume")
            del self.state.nodes[name]
            return
        node = await self.slurm.node(name)
        if not node.ours:
            self._release(name, record, f"reason now {node.reason!r}: not gpufleet's to resume")
            return
        if self.check is not None:
            passed, output = await self.check.run(name)
            self._audit("check", name, "ok" if passed else "failed", why=output)
            if not passed:
                record.phase, record.why = "failed", output
                await self.slurm.drain(name, f"{REASON_PREFIX}check failed after repair: {output}"[:250])
                return
        await self.slurm.resume(name)
        del self.state.nodes[name]
        self._audit("resume", name, "ok", why=node.reason)

    async def refresh(self) -> None:
        """Slurm's node list: the breaker's partition sizes, the webhook's known nodes, and each node's state and
        reason on /metrics, which the rules read to tell planned work (a maintenance reservation, a drain for
        maintenance) from a fault."""
        try:
            self.known = await self.slurm.nodes()
            self._remember_ends(await self.slurm.maintenance_ends())
            self.slurm_up = True
        except SlurmError as err:
            self.slurm_up = False
            self.slurm_errors += 1
            log.warning("slurm: cannot list nodes or reservations: %s", err)

    def _remember_ends(self, active: dict[str, float]) -> None:
        """The stated end of each node's maintenance: that of the active maintenance reservations holding it, or,
        once they have ended, the last one's for as long as Slurm keeps the node out of service (a drain or down for
        the work, which the rules judge) and knows it."""
        ends = self.state.maintenance_ends
        for name in list(ends):
            node = self.known.get(name)
            if name not in active and (node is None or not node.states & _OUT_OF_SERVICE):
                del ends[name]
        ends.update(active)
        self.files.save(self.state)

    def close_breaker(self, who: str) -> None:
        self._audit("breaker", "-", "closed", why=f"closed by {who}; it was: {self.state.breaker.why}")
        self.state.breaker.open, self.state.breaker.why = False, ""
        self.state.drains.clear()
        self.files.save(self.state)
        self.wake.set()

    async def run(self, interval: float, list_interval: float = 30.0) -> None:
        """Steps at least every `interval` seconds, and at once after a webhook; Slurm's node list at most every
        `list_interval`: a maintenance declared in Slurm silences its node's pages only once it is listed."""
        listed = -math.inf
        while True:
            if time.monotonic() - listed >= list_interval:
                listed = time.monotonic()
                await self.refresh()
            try:
                await self.step()
            except Exception:  # A fault of its own must not end the loop while the webhook still answers.
                log.exception("remediation pass failed; the next one starts in %gs", interval)
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), interval)
            except TimeoutError:
                pass

    def _audit(self, action: str, node: str, result: str, why: str = "", alert: Alert | None = None,
               causes: dict[str, str] | None = None, level: int = logging.INFO) -> None:
        """One line of the audit log (and of the log) per decision, with the alert that caused it."""
        if action not in ("alert", "release"):
            self.actions[(action, result)] += 1
        entry: dict[str, object] = {"time": round(self.clock(), 3), "action": action, "node": node,
                                    "result": result, "dry_run": self.settings.dry_run, "why": why}
        if causes:  # The firing alerts (fingerprint: reason) the action answers.
            entry["alerts"] = dict(causes)
        if alert is not None:
            entry["alert"] = {"labels": alert.labels, "starts_at": alert.starts_at, "fingerprint": alert.fingerprint}
        log.log(level, "%s %s: %s%s", action, node, result, f" ({why})" if why else "")
        if self.audit_path is not None:
            try:
                with self.audit_path.open("a") as audit:
                    audit.write(json.dumps(entry, sort_keys=True) + "\n")
            except OSError as err:
                log.error("audit file %s: %s; the entry is in this log only", self.audit_path, err)
