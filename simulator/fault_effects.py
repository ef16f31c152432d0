"""What the faults do to a simulated node's boards: the health state NVML reports, and the XIDs it raises.

Each collection brings every board's health fields (lost, slowdown reasons,
violation time, ECC, row remaps, PCIe replays, NVLinks) to what the node's
faults say at its frozen clock; the simulated NVML library then answers from them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pynvml

from gpufleet.exporter.gpu.simulated.board import SimulatedGpu, nvlink_kib_for
from gpufleet.exporter.gpu.simulated.host import random_uuid
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.simulator.faults import OLDER_DRIVER, REBOOTS, XIDS, Cause, Fault
from gpufleet.simulator.faults import FaultKind as Kind
from gpufleet.simulator.kernel_log import SimulatedKernelLog
from gpufleet.simulator.node_state import NodeState
from gpufleet.simulator.timeline import overlap
from gpufleet.simulator.workload import Workload
from gpufleet.xid import GSP_TIMEOUT, Action, action_for

# The repairs that reset a GPU (an operator's reset, of the GPU or of its whole board; a reboot or a new board reset
# it too), that reboot it, and that put a new board in its slot.
_RESETS = frozenset({Kind.GPU_RESET, Kind.BOARD_RESET, *REBOOTS})
_NEW = frozenset({Kind.GPU_REPLACE})
# nvmlGpuFabricInfo_v3_t's health flag for degraded bandwidth, set.
_DEGRADED_BANDWIDTH = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
                       << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)


class FaultEffects:
    """Sets one node's boards' health from its faults, and raises each fault's XID once."""

    def __init__(self, state: NodeState, boards: list[SimulatedGpu], workload: Workload, nvml: SimulatedNvml,
                 kernel_log: SimulatedKernelLog) -> None:
        self.state = state
        self.boards = boards
        self.workload = workload
        self.nvml = nvml
        self.kernel_log = kernel_log

    def apply(self) -> None:
        """Bring every board's health state to what the faults say at the node's time, and raise the XIDs that
        have come due."""
        t = self.state.t
        # A straggler capped by heat or power holds every board's slowdown reason, for as long as it lasts.
        hot, braked = self.state.straggling(Cause.THERMAL), self.state.straggling(Cause.POWER)
        hot_seconds = self.state.seconds_active(Kind.STRAGGLER, cause=Cause.THERMAL)
        braked_seconds = self.state.seconds_active(Kind.STRAGGLER, cause=Cause.POWER)
        for board in self.boards:
            gpu = board.index
            # A repair ends what began before it: a reset clears the volatile ECC count and applies pending row
            # remaps; a reboot also brings a lost GPU back; a new board has none of the old one's errors.
            reset, rebooted, replaced = (self.state.repaired_at(kinds, gpu) for kinds in (_RESETS, REBOOTS, _NEW))
            lost = (any(f.active(t) and f.start > rebooted for f in self.state.active(Kind.GPU_LOST, gpu))
                    or any(f.active(t) for f in self.state.active(Kind.GPU_DEAD, gpu)))
            resetting = any(f.active(t) for f in [*self.state.active(Kind.GPU_RESET, gpu),
                                                  *self.state.active(Kind.BOARD_RESET)])
            board.errors = {"*": pynvml.NVML_ERROR_GPU_IS_LOST} if lost or resetting else {}
            events = 0
            if any(f.active(t) for f in self.state.active(Kind.THERMAL_SLOWDOWN, gpu)):
                events |= pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
            if hot:
                events |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
            if any(f.active(t) for f in self.state.active(Kind.POWER_BRAKE, gpu)) or braked:
                events |= pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown
            board.clock_events = events
            board.violation_seconds = {
                pynvml.NVML_PERF_POLICY_THERMAL: self.state.seconds_active(Kind.THERMAL_SLOWDOWN, gpu) + hot_seconds,
                pynvml.NVML_PERF_POLICY_POWER: self.state.seconds_active(Kind.POWER_BRAKE, gpu) + braked_seconds,
            }
            self._memory(board, reset, replaced)
            board.pcie_replays = self.state.counted(Kind.PCIE_REPLAY_STORM, gpu)
            self._fabric(board, reset)
            self._settings(board)
            down = {f.link: f for f in self.state.active(Kind.NVLINK_DOWN, gpu) if f.active(t) and f.link is not None}
            board.nvlinks_down = set(down)
            board.nvlink_stopped_kib = {link: nvlink_kib_for(self.workload.energy(board, f.start))
                                        for link, f in down.items()}
            board.nvlink_errors = {}
            for fault in self.state.active(Kind.NVLINK_CRC, gpu):
                if fault.link is not None:
                    key = (fault.link, "crc_flit")
                    errors = int(fault.size * overlap(fault.start, fault.end, t))
                    board.nvlink_errors[key] = board.nvlink_errors.get(key, 0) + errors
        self.nvml.hung = self._hung()
        self._fire_events()
        self._log_kernel_events()

    def _hung(self) -> bool:
        """Whether a driver_hang holds the node's driver now: from its start until it ends, or until its GPU's reset
        or the node's reboot begins (a reset, unlike the hang, takes the GPU off the bus for a moment)."""
        t = self.state.t
        faults = self.state.fleet.faults_for(self.state.name)
        return any(hang.active(t) and not any(
            repair.kind in _RESETS and repair.gpu in (None, hang.gpu or 0) and hang.start < repair.start <= t
            for repair in faults) for hang in self.state.active(Kind.DRIVER_HANG))

    def _fabric(self, board: SimulatedGpu, repaired: float) -> None:
        """The board's NVSwitch fabric: registration stalled in progress, until a reset or reboot after the fault
        began registers it again; or running at limited capacity."""
        t = self.state.t
        stalled = any(f.active(t) and f.start > repaired
                      for f in self.state.active(Kind.FABRIC_NOT_READY, board.index))
        degraded = any(f.active(t) for f in self.state.active(Kind.FABRIC_DEGRADED, board.index))
        board.fabric_state = (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS if stalled
                              else pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
        board.fabric_health_mask = _DEGRADED_BANDWIDTH if degraded else 0
        board.fabric_health_summary = (pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY if degraded
                                       else pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)

    def _log_kernel_events(self) -> None:
        """Each kernel_events or SXid fault's messages due by now, written once each."""
        t = self.state.t
        for fault in self.state.fleet.faults_for(self.state.name):
            if fault.kind is Kind.KERNEL_EVENTS or fault.kind is Kind.SXID_NONFATAL:
                due = int(fault.size * overlap(fault.start, fault.end, t))
            elif fault.kind is Kind.SXID_FATAL:
                due = 1 if fault.start <= t else 0
            else:
                continue
            written = self.state.kernel_messages.get(fault.id, 0)
            if due <= written:
                continue
            if fault.kind is Kind.KERNEL_EVENTS and fault.event is not None:
                self.kernel_log.write(fault.event, due - written)
            elif fault.kind is not Kind.KERNEL_EVENTS:
                self.kernel_log.write_sxid(24007 if fault.kind is Kind.SXID_FATAL else 20001, due - written)
            self.state.kernel_messages[fault.id] = due

    def _settings(self, board: SimulatedGpu) -> None:
        """What an operator set on the board, while the fault that set it lasts: ECC, persistence mode, a power
        limit below the board's default."""
        t = self.state.t
        if ecc := self.state.active(Kind.ECC_DISABLED, board.index):
            board.ecc_mode = board.ecc_pending_mode = 0 if any(f.active(t) for f in ecc) else 1
        if persistence := self.state.active(Kind.PERSISTENCE_OFF, board.index):
            off = any(f.active(t) for f in persistence)
            board.persistence_mode = pynvml.NVML_FEATURE_DISABLED if off else pynvml.NVML_FEATURE_ENABLED
        if board.power_limit_default_watts is None:
            board.power_limit_default_watts = board.power_limit_watts
        caps = [f.size for f in self.state.active(Kind.POWER_CAPPED, board.index) if f.active(t)]
        board.power_limit_watts = board.power_limit_default_watts * min(caps, default=1.0)

    def _memory(self, board: SimulatedGpu, reset: float, replaced: float) -> None:
        """The board's uncorrectable errors, row remaps and the driver's verdict on them, since its board was
        fitted (`replaced`) and its last reset."""
        gpu, t = board.index, self.state.t

        def on_this_board(kind: Kind) -> list[Fault]:
            return [f for f in self.state.active(kind, gpu) if replaced < f.start <= t]

        dbe = [f.start for f in on_this_board(Kind.ECC_DBE)]
        contained = on_this_board(Kind.ECC_CONTAINED)
        volatile = sum(1 for start in dbe if start > reset)
        since_reset = volatile + sum(1 for f in contained if f.start > reset)
        board.ecc_errors = {("uncorrected", "volatile"): since_reset,
                            ("uncorrected", "aggregate"): len(dbe) + len(contained)}
        # A contained error remaps its row at the next reset, as a pending remap does.
        pending = [*on_this_board(Kind.ROW_REMAP_PENDING), *contained]
        failed = on_this_board(Kind.ROW_REMAP_FAILURE)
        board.remapped_rows = {"uncorrectable": len(pending) + len(failed)}
        board.row_remap_pending = any(f.active(t) and f.start > reset for f in pending)
        board.row_remap_failed = any(f.active(t) for f in failed)
        # The driver's own verdict (NVML's recovery action): a reset, after an uncontained uncorrectable error or an
        # XID that calls for one, until the GPU is reset; none after a contained one, as NVIDIA's memory error
        # management guide has it.
        self.nvml.set_recovery_action(gpu, 1 if volatile or self._reset_xid_since(gpu, reset) else 0)

    def _reset_xid_since(self, gpu: int, reset: float) -> bool:
        """Whether an XID that calls for a GPU reset has been raised on `gpu` since it was last reset."""
        return any(f.xid is not None and action_for(f.xid) is Action.RESET and reset < f.start <= self.state.t
                   for f in self.state.active(Kind.XID, gpu))

    def change_boards(self, reboots: Sequence[Fault]) -> list[SimulatedGpu]:
        """What the reboots that ended did to the node: a replaced board has a new identity (another UUID and
        serial in the same slot, as a new board at the same PCI address shows); a removed one is gone from the
        node, and NVML numbers the others without it; a driver mismatch leaves the older driver loaded. Returns
        the removed boards."""
        removed = []
        for fault in reboots:
            if fault.kind is Kind.DRIVER_MISMATCH:
                self.nvml.driver_version = OLDER_DRIVER
            board = next((b for b in self.boards if b.index == fault.gpu), None)
            if board is None:
                continue
            if fault.kind is Kind.GPU_REPLACE:
                rng = random.Random(f"replace:{self.state.name}:{fault.id}")
                board.uuid = f"GPU-{random_uuid(rng)}"
                board.serial = str(rng.randrange(10**12, 10**13))
            elif fault.kind is Kind.GPU_REMOVED:
                self.boards.remove(board)
                removed.append(board)
        return removed

    def _fire_events(self) -> None:
        """Raise each fault's XID once, when the node's time first passes the fault's start: in the kernel log, as
        the driver logs every XID, and as NVML's event, which a hung driver does not deliver (the exporter counts
        the two once)."""
        for fault in self.state.fleet.faults_for(self.state.name):
            code = fault.xid if fault.kind in (Kind.XID, Kind.JOB_HANG) else XIDS.get(fault.kind)
            if fault.kind is Kind.DRIVER_HANG:
                code = GSP_TIMEOUT
            if code is None or fault.start > self.state.t or fault.id in self.state.fired:
                continue
            self.state.fired.add(fault.id)
            self.nvml.inject_xid(fault.gpu or 0, code)
            board = next((b for b in self.boards if b.index == (fault.gpu or 0)), None)
            if board is not None:
                self.kernel_log.write_xid(board.pci_bus_id, code)
