"""The recovery action each GPU needs, held until the GPU is seen fixed, never for a fixed time.

A page that resolves fifteen minutes after an XID, while the GPU still needs its reset, tells the on-call
engineer the problem went away. So each GPU's action (`gpufleet_gpu_recovery_action`, one series per GPU
whose value is the action) is raised by what the hardware reports and lowered only by what fixes it:

- the driver's own verdict (NVML's recovery-action field, and its event between two collections), where it
  has one, raises it to that action; the driver reporting none after having reported one lowers a DRAIN or
  RESET;
- an XID of the reset-or-reboot class raises it to RESET, REBOOT for 79 (off the bus), REPLACE for 64 (a row
  remap failure) (`gpufleet.xid.action_for`);
- uncorrectable ECC errors counted since the driver loaded (volatile) raise it to RESET; the volatile count
  falling (a reset clears it) lowers it. Where the GPU reported them as contained (XID 94, and no XID 95 or 48
  since its last repair), only the job that touched the memory was killed and the GPU keeps working: the reset
  is deferred to the next drain (`gpufleet_gpu_recovery_action_deferred`), a ticket rather than a page, until an
  uncontained error or another demand for a reset makes it urgent. A count read before any memory XID waits for
  one as long as the XID ledger may take to count it;
- a failed row remap raises it to REPLACE, which only another board (another UUID) at the GPU's PCI address
  lowers;
- a fatal NVSwitch error (SXid, from the kernel log) raises every GPU of the board to RESET, held for the board as
  a whole (`raise_board`): the NVLink fabric it stalled is the board's, and NVIDIA's remedy is to reset every GPU
  and NVSwitch of the board together, or reboot. One GPU reset alone ends nothing; the holds end together once
  each of those GPUs has left NVML and come back since the error (or the node rebooted), and every one of them
  answers registered with the fabric again (or has no fabric to register with). Which GPUs left and came back is
  this process's own observation: an exporter restarted in the middle of a board reset leaves the holds to the
  node's next reboot.

Whatever raised it, DRAIN and RESET also end when the GPU leaves NVML and comes back (a reset takes it off
the bus for a moment), and DRAIN, RESET and REBOOT when the node's boot time changes (a reboot) and the GPU
answers after it: a reboot that does not bring the GPU back fixed nothing, and its hold carries on from the new
boot. REPLACE ends only with another board. The larger action covers the smaller: a GPU held at REBOOT needs no
separate reset.

While NVML does not answer at all (a hung driver), XIDs still arrive from the kernel log and raise actions for the
GPUs seen before (`raise_from_xids`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import pynvml
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpufleet.exporter.gpu.fabric import HEALTH as FABRIC_HEALTH
from gpufleet.exporter.gpu.fabric import STATE as FABRIC_STATE
from gpufleet.exporter.gpu.probes import DRIVER_RECOVERY_ACTION, ECC_ERRORS, ROW_REMAP_FAILED, Reading
from gpufleet.exporter.gpu.session import GpuIdentity, GpuSample
from gpufleet.exporter.gpu.xid import XidCount
from gpufleet.exporter.sxid import Sxid
from gpufleet.fabric import BOARD_RESET_REASON, REGISTRATION_FAILED
from gpufleet.xid import CONTAINED_ECC, DOUBLE_BIT_ECC, UNCONTAINED_ECC, Action, action_for

# NVML's recovery actions (nvmlGpuRecoveryAction_t) as the actions an operator takes.
DRIVER_ACTIONS = {
    pynvml.NVML_GPU_RECOVERY_ACTION_NONE: Action.NONE,
    pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET: Action.RESET,
    pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT: Action.REBOOT,
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: Action.DRAIN,
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET: Action.RESET,
    pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN: Action.DRAIN,
    pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET: Action.RESET,
    pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT: Action.REBOOT,
}
_SETTLED_BY_RESET = (Action.DRAIN, Action.RESET)
_SETTLED_BY_REBOOT = (Action.DRAIN, Action.RESET, Action.REBOOT)
# Why a GPU needs a reset, where its uncorrectable ECC count alone says so.
_UNCORRECTABLE = "uncorrectable ECC errors since the driver loaded"
_CONTAINED = "a contained uncorrectable ECC error (XID 94): reset at the next drain"
_UNCONTAINED_XIDS = frozenset({DOUBLE_BIT_ECC, UNCONTAINED_ECC})


@dataclass
class Held:
    """One GPU's action, with what raised it and when, and the node's boot time then."""

    uuid: str
    action: Action
    reason: str
    since: float
    boot: float | None
    driver: bool = False  # The driver asked for it: its "none" afterwards means it was done.
    deferred: bool = False  # It can wait for the node's next drain: a contained memory error.
    board: bool = False  # Held for the whole board (a fatal SXid): it ends with the board's other holds.


@dataclass(frozen=True)
class _Seen:
    """What the last observation saw of one GPU, to tell what changed since."""

    uuid: str
    present: bool
    driver: Action | None
    volatile_dbe: float | None


@dataclass(frozen=True)
class _Health:
    """The readings of one GPU that its action depends on, picked out of its sample once."""

    driver: float | None = None  # NVML's recovery action, where the driver reports one.
    volatile_dbe: float | None = None  # Uncorrectable ECC errors since the driver loaded.
    remap_failed: bool = False
    registered: bool = False  # Registered with the NVSwitch fabric, or on a board without one.

    @classmethod
    def of(cls, readings: Sequence[Reading]) -> _Health:
        driver = dbe = state = fabric_health = None
        failed = False
        for r in readings:
            if r.metric is DRIVER_RECOVERY_ACTION:
                driver = r.value
            elif r.metric is ECC_ERRORS and r.label_values == ("uncorrected", "volatile"):
                dbe = r.value
            elif r.metric is ROW_REMAP_FAILED:
                failed = r.value == 1
            elif r.metric is FABRIC_STATE:
                state = r.value
            elif r.metric is FABRIC_HEALTH:
                fabric_health = r.value
        registered = state is None or (state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
                                       and fabric_health != REGISTRATION_FAILED)
        return cls(driver, dbe, failed, registered)


def _held(entry: object) -> Held | None:
    """One held action as the state file keeps it; None where it does not parse."""
    if not isinstance(entry, dict):
        return None
    try:
        boot = entry.get("boot")
        return Held(str(entry["uuid"]), Action(int(str(entry["action"]))), str(entry["reason"]),
                    float(str(entry["since"])), None if boot is None else float(str(boot)),
                    bool(entry.get("driver", False)), bool(entry.get("deferred", False)),
                    bool(entry.get("board", False)))
    except (KeyError, ValueError):
        return None


class ActionBook:
    """Every GPU's held action, by PCI address: what a node's slots need, whichever board is in them."""

    def __init__(self, clock: Callable[[], float] = time.time, xid_wait: float = 10.0) -> None:
        self._clock = clock
        self._xid_wait = xid_wait
        self.held: dict[str, Held] = {}
        self._seen: dict[str, _Seen] = {}
        # The XID counts seen, by (UUID, code): a count above its entry is a new XID. A restored state sets it
        # to the counts kept, so that an XID is acted on once, whichever process saw it.
        self._xids: dict[tuple[str, int], int] = {}
        # The memory XIDs (contained, uncontained) each GPU reported since its last repair, by UUID: whether its
        # uncorrectable ECC errors were contained.
        self._memory_xids: dict[str, set[int]] = {}
        # The GPUs whose uncorrectable ECC count was read with no memory XID told yet: when it was first read, by UUID.
        self._counted_alone: dict[str, float] = {}
        self._identities: dict[str, GpuIdentity] = {}
        # The GPUs seen to leave NVML and come back since the board's latest fatal SXid, by PCI address.
        self._board_reset: set[str] = set()

    def observe(self, answering: Sequence[GpuSample], lost: Sequence[GpuIdentity], xids: Sequence[XidCount],
                boot: float | None, verdicts: Mapping[str, Sequence[int]] | None = None) -> list[str]:
        """Raise and lower every GPU's action from one collection, after the driver verdicts its events announced
        since the last one (`verdicts`, by UUID, oldest first); returns what changed, as log lines."""
        changes: list[str] = []
        new_xids = self._new_xids(xids)
        registered: dict[str, bool] = {}
        for sample in answering:
            self._identities[sample.identity.pci_bus_id] = sample.identity
            for verdict in (verdicts or {}).get(sample.identity.uuid, ()):
                changes += self._verdict(sample.identity, verdict, boot)
            health = _Health.of(sample.readings)
            registered[sample.identity.pci_bus_id] = health.registered
            changes += self._settle(sample.identity, True, health, boot)
            changes += self._raise(sample.identity, health, new_xids.get(sample.identity.uuid, ()), boot)
        for identity in lost:
            self._identities[identity.pci_bus_id] = identity
            for verdict in (verdicts or {}).get(identity.uuid, ()):  # Given before it fell off the bus.
                changes += self._raise(identity, _Health(driver=float(verdict)), (), boot)
            changes += self._settle(identity, False, _Health(), boot)
            changes += self._raise(identity, _Health(), new_xids.get(identity.uuid, ()), boot)
        return changes + self._settle_board(registered, boot)

    def raise_board(self, sxids: Sequence[Sxid], boot: float | None) -> list[str]:
        """Hold every GPU of the node's board at a reset for the fatal SXids logged since the last call (the first
        names the hold): a GPU held at more (a reboot, a replacement) keeps that, which covers it; one held at a
        reset of its own is held for the board instead, now, as a deferred one can no longer wait. Resets seen
        before the error repaired nothing of it."""
        if not sxids:
            return []
        first = sxids[0]
        reason = f"{BOARD_RESET_REASON} {first.code} on NVSwitch {first.switch}: reset the whole board"
        self._board_reset.clear()
        changes = []
        for pci, identity in sorted(self._identities.items(), key=lambda item: item[1].index):
            held = self.held.get(pci)
            mine = held is not None and held.uuid == identity.uuid
            if held is not None and mine and held.action > Action.RESET:
                continue
            if held is not None and mine and held.board:
                held.boot = boot  # A later error: the reboot that ends it must come after this one too.
                continue
            self.held[pci] = Held(identity.uuid, Action.RESET, reason, self._clock(), boot, board=True)
            changes.append(f"GPU {identity.index} ({identity.uuid}) needs reset with its whole board: {reason}")
        return changes

    def raise_from_xids(self, xids: Sequence[XidCount], boot: float | None) -> list[str]:
        """Raise the actions of the XIDs counted since the last observation, for GPUs seen before that NVML cannot
        be asked about now (a hung driver, whose XIDs only the kernel log still tells)."""
        by_uuid = {identity.uuid: identity for identity in self._identities.values()}
        changes: list[str] = []
        for uuid, codes in self._new_xids(xids).items():
            if uuid in by_uuid:
                changes += self._raise(by_uuid[uuid], _Health(), codes, boot)
        return changes

    def know(self, identities: Sequence[GpuIdentity]) -> None:
        """Report these GPUs from now on (an inventory kept by a previous process), before any is observed."""
        self._identities.update((identity.pci_bus_id, identity) for identity in identities)

    def forget(self, pci: str) -> None:
        """The slot's GPU was taken out on purpose: nothing is held for it, and it is no longer reported."""
        for book in (self.held, self._seen, self._identities):
            book.pop(pci, None)
        self._board_reset.discard(pci)

    def absent(self) -> None:
        """NVML answers for no GPU at all: each GPU counts as having left, for when it comes back."""
        self._seen = {pci: _Seen(seen.uuid, False, None, None) for pci, seen in self._seen.items()}

    def _new_xids(self, xids: Sequence[XidCount]) -> dict[str, list[int]]:
        """The XID codes counted since the last observation, by GPU UUID."""
        counts: dict[tuple[str, int], int] = {}
        for x in xids:  # A GPU's index can change across restarts: its counts are summed by UUID.
            counts[(x.uuid, x.xid)] = counts.get((x.uuid, x.xid), 0) + x.count
        new: dict[str, list[int]] = {}
        for (uuid, xid), count in counts.items():
            if count > self._xids.get((uuid, xid), 0):
                new.setdefault(uuid, []).append(xid)
                if xid == CONTAINED_ECC or xid in _UNCONTAINED_XIDS:
                    self._memory_xids.setdefault(uuid, set()).add(xid)
        self._xids.update(counts)
        return new

    def _verdict(self, identity: GpuIdentity, verdict: int, boot: float | None) -> list[str]:
        """A verdict the driver gave between two collections, taken as a collection that read only it would take
        it: one given and taken back before the next collection is still seen, and seen done."""
        seen = self._seen.get(identity.pci_bus_id)
        health = _Health(driver=float(verdict), volatile_dbe=seen.volatile_dbe if seen else None)
        return self._settle(identity, True, health, boot) + self._raise(identity, _Health(driver=float(verdict)), (),
                                                                        boot)

    def _settle(self, identity: GpuIdentity, present: bool, health: _Health, boot: float | None) -> list[str]:
        """Lower the GPU's action where what fixes it was seen."""
        pci = identity.pci_bus_id
        driver = DRIVER_ACTIONS.get(int(health.driver)) if health.driver is not None else None
        dbe = health.volatile_dbe
        before = self._seen.get(pci)
        self._seen[pci] = _Seen(identity.uuid, present, driver, dbe)
        if present and before is not None and not before.present:
            self._board_reset.add(pci)
        held = self.held.get(pci)
        if held is None:
            return []
        why = None
        rebooted = boot is not None and held.boot is not None and boot != held.boot
        if held.uuid != identity.uuid:
            why = f"another board ({identity.uuid}) sits at {pci}"
        elif rebooted and not present and held.action in _SETTLED_BY_REBOOT:
            held.boot = boot  # The next reboot that brings it back is the repair.
            held.reason = f"{held.reason.split('; ')[0]}; still lost after a reboot"
            return [f"GPU {identity.index} ({identity.uuid}) still needs {held.action.name.lower()}: the node "
                    "rebooted and the GPU did not come back"]
        elif held.board:
            return []  # The board's holds end together (`_settle_board`).
        elif rebooted and held.action in _SETTLED_BY_REBOOT:
            why = "the node rebooted"
        elif held.action in _SETTLED_BY_RESET and present and before is not None:
            if not before.present:
                why = "the GPU left NVML and came back"
            elif held.driver and driver is Action.NONE and before.driver not in (None, Action.NONE):
                why = "the driver asks for nothing any more"
            elif dbe is not None and before.volatile_dbe is not None and dbe < before.volatile_dbe:
                why = "its volatile ECC counts were cleared by a reset"
        if why is None:
            return []
        del self.held[pci]
        self._memory_xids.pop(identity.uuid, None)  # Repaired: its next memory error is judged afresh.
        return [f"GPU {identity.index} ({identity.uuid}) no longer needs {held.action.name.lower()}: {why}"]

    def _settle_board(self, registered: Mapping[str, bool], boot: float | None) -> list[str]:
        """End the board's holds once every GPU of the board, held for it or for more, was reset since the error
        (or the node rebooted since), and each held for it answers registered with the fabric again (`registered`,
        by PCI address, for the GPUs that answered)."""
        board = {pci: held for pci, held in self.held.items() if held.board}
        if not board:
            return []
        since = next(iter(board.values())).boot
        rebooted = boot is not None and since is not None and boot != since
        if not rebooted and not set(self._identities) <= self._board_reset:
            return []
        if not all(registered.get(pci, False) for pci in board):
            return []
        changes = []
        for pci, held in sorted(board.items()):
            del self.held[pci]
            self._memory_xids.pop(held.uuid, None)
            identity = self._identities.get(pci)
            changes.append(f"GPU {identity.index if identity else pci} ({held.uuid}) no longer needs reset: its whole "
                           "board was reset, or the node rebooted, and it answers registered with its fabric")
        self._board_reset.clear()
        return changes

    def _raise(self, identity: GpuIdentity, health: _Health, new_xids: Sequence[int],
               boot: float | None) -> list[str]:
        """Raise the GPU's action to what the driver, a new XID, its ECC counts or its row remapper call for."""
        demands: list[tuple[Action, str, bool]] = []
        driver_value = health.driver
        if driver_value is not None and DRIVER_ACTIONS.get(int(driver_value), Action.NONE) is not Action.NONE:
            demands.append((DRIVER_ACTIONS[int(driver_value)], f"the driver asks for it (action {int(driver_value)})",
                            True))
        demands += [(action_for(xid), f"XID {xid}", False) for xid in new_xids if action_for(xid) is not Action.NONE]
        # The XID that tells a contained error from an uncontained one may reach the ledger after the count is read
        # (a kernel-log XID is counted once NVML's events had their chance at it): a count with no memory XID waits
        # `xid_wait` for it.
        memory = self._memory_xids.get(identity.uuid, set())
        if not health.volatile_dbe:
            self._counted_alone.pop(identity.uuid, None)
        elif memory or self._clock() - self._counted_alone.setdefault(identity.uuid, self._clock()) >= self._xid_wait:
            contained = CONTAINED_ECC in memory and not memory & _UNCONTAINED_XIDS
            demands.append((Action.RESET, _CONTAINED if contained else _UNCORRECTABLE, False))
        if health.remap_failed:
            demands.append((Action.REPLACE, "a row remap failed", False))
        changes = []
        for action, reason, from_driver in demands:
            held = self.held.get(identity.pci_bus_id)
            if held is not None and held.uuid == identity.uuid and held.action >= action:
                held.driver = held.driver or (from_driver and held.action == action)
                changes += self._urgency(identity, held, action, reason)
                continue
            self.held[identity.pci_bus_id] = Held(identity.uuid, action, reason, self._clock(), boot, from_driver,
                                                  deferred=reason == _CONTAINED)
            changes.append(f"GPU {identity.index} ({identity.uuid}) needs {action.name.lower()}: {reason}")
        return changes

    def _urgency(self, identity: GpuIdentity, held: Held, action: Action, reason: str) -> list[str]:
        """A deferred reset made urgent by another demand for one (an uncontained error's XID, the driver's
        verdict), not by the ECC count it was deferred for, which a restarted exporter reads with no XID beside it;
        an urgent reset raised only by the ECC count deferred once the GPU tells the error was contained (its XID 94
        may come after the wait for it)."""
        if held.action != action:
            return []
        if held.deferred and reason not in (_CONTAINED, _UNCORRECTABLE):
            held.deferred, held.reason, held.since = False, reason, self._clock()
        elif not held.deferred and held.reason == _UNCORRECTABLE and reason == _CONTAINED:
            held.deferred, held.reason = True, reason
        else:
            return []
        when = "at the next drain" if held.deferred else "now"
        return [f"GPU {identity.index} ({identity.uuid}) needs {action.name.lower()} {when}: {reason}"]

    def kept(self) -> dict[str, dict[str, object]]:
        """The held actions as the state file keeps them."""
        return {pci: {**asdict(held), "action": int(held.action)} for pci, held in sorted(self.held.items())}

    def restore(self, kept: dict[str, object], boards: dict[str, str],
                xids: Sequence[XidCount]) -> tuple[int, list[str]]:
        """Hold again what a previous process held, for the boards in their slots now (`boards`: PCI address to
        UUID), and take its XID counts (`xids`) as already acted on. An entry whose slot holds another board is
        settled: the board was replaced while no exporter watched (or the file is another host's). Returns how many
        entries were dropped (those, and any that do not parse) and the settled ones' log lines."""
        for x in xids:
            self._xids[(x.uuid, x.xid)] = self._xids.get((x.uuid, x.xid), 0) + x.count
        ignored, changes = 0, []
        for pci, entry in kept.items():
            held = _held(entry)
            if held is None:
                ignored += 1
                continue
            if boards.get(pci) == held.uuid:
                self.held[pci] = held
                continue
            ignored += 1
            if pci in boards:
                changes.append(f"the GPU at {pci} no longer needs {held.action.name.lower()}: another board "
                               f"({boards[pci]}) sits there")
        return ignored, changes

    def families(self) -> list[Metric]:
        """Every GPU's action, and why, for each GPU seen answering or lost."""
        action = GaugeMetricFamily(
            "gpufleet_gpu_recovery_action",
            "What the GPU needs before it runs work again, held until that is seen done: 0 nothing, 1 drain, "
            "2 reset, 3 reboot the node, 4 replace the board.", labels=("gpu", "uuid"))
        reason = GaugeMetricFamily("gpufleet_gpu_recovery_action_reason",
                                   "Why the GPU is held at its recovery action, and since when (Unix time).",
                                   labels=("gpu", "uuid", "reason"))
        # One series per GPU from the start, as the action's: a series that appeared with the deferral would reach
        # VictoriaMetrics' queries seconds after the action it qualifies, and vmalert paged for a contained error.
        deferred = GaugeMetricFamily("gpufleet_gpu_recovery_action_deferred",
                                     "1 while the GPU's held action can wait for its node's next drain (a contained "
                                     "memory error), else 0.", labels=("gpu", "uuid"))
        for pci, identity in sorted(self._identities.items(), key=lambda item: item[1].index):
            held = self.held.get(pci)
            current = held if held is not None and held.uuid == identity.uuid else None
            labels = [str(identity.index), identity.uuid]
            action.add_metric(labels, float(current.action) if current else 0.0)
            if current is not None:
                reason.add_metric([*labels, current.reason], current.since)
            deferred.add_metric(labels, float(current is not None and current.deferred))
        return [family for family in (action, reason, deferred) if family.samples]
