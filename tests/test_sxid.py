"""NVSwitch SXids: the driver's lines read as it writes them, counted once per error by the kernel collector, and
kept across an exporter's restart until the node boots again; a fatal one holds every GPU of the board at a reset
until the whole board was reset, or the node rebooted, and the fabric registered each GPU again."""

import pynvml
import pytest

from gpufleet.devtools.nodes import UUID0, UUID1, two_boards
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.collector.kernel import KernelCollector
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.xid import KernelLogXids, XidLedger
from gpufleet.exporter.state import FileStore, MemoryStore, PersistentState
from gpufleet.exporter.sxid import Sxid, parse_sxid
from gpufleet.exporter.tree import MemoryTree
from gpufleet.simulator.kernel_log import NVSWITCH, SimulatedKernelLog
from gpufleet.xid import Action

from helpers import named, rendered

SXIDS = "gpufleet_nvswitch_sxid_errors_total"


def test_primary_lines_are_sxids_and_the_lines_that_follow_them_are_not():
    # As NVIDIA's Fabric Manager guide and the driver print them: the switch's address with its function.
    assert parse_sxid("nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO "
                      "(First)") == Sxid("0000:c1:00.0", 28006, "non_fatal")
    assert parse_sxid("[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0004:C3:00.0): 24007, Fatal, Link 28 "
                      "sourcetrack timeout error (First)") == Sxid("0004:c3:00.0", 24007, "fatal")
    assert parse_sxid("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 10003, Fatal, unhandled interrupt in "
                      "soe(0)") == Sxid("0000:84:00.0", 10003, "fatal")
    assert parse_sxid("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 20009, Correctable, Link 02 RX short error "
                      "rate") == Sxid("0000:84:00.0", 20009, "correctable")
    for follower in ("nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Severity 0 Engine instance 46 Sub-engine "
                     "instance 00",
                     "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500}",
                     "NVRM: Xid (PCI:0000:18:00): 79, pid=2181, name=python3, GPU has fallen off the bus."):
        assert parse_sxid(follower) is None, follower


def _node(boot: int, store: MemoryStore, log: SimulatedKernelLog) -> KernelCollector:
    procfs = MemoryTree()
    procfs.set("stat", f"cpu 1 2 3\nbtime {boot}\n")
    collector = KernelCollector(log, PersistentState(store), procfs)
    collector.start()
    return collector


def _sxids(collector: KernelCollector) -> dict[tuple[str, str], float]:
    return {(dict(l)["sxid"], dict(l)["class"]): v for l, v in named(rendered(collector.collect()), SXIDS).items()}


def test_sxids_are_counted_once_each_and_kept_until_the_node_boots_again():
    log, store = SimulatedKernelLog(), MemoryStore()
    first = _node(1000, store, log)
    assert _sxids(first) == {}  # Sparse: no series before a switch's first error.
    log.write_sxid(24007, 1)  # With its data line.
    log.write_sxid(20001, 3)
    assert _sxids(first) == {("24007", "fatal"): 1, ("20001", "non_fatal"): 3}
    first.close()
    # The exporter restarts within the same boot (its time a second later, as NTP steered the clock): the fatal
    # error still stands, though the log is read from its end.
    again = _node(1001, store, log)
    log.write_sxid(20001, 1)
    assert _sxids(again) == {("24007", "fatal"): 1, ("20001", "non_fatal"): 4}
    again.close()
    # The node rebooted: the switches were reset with it, and their errors are gone.
    assert _sxids(_node(2000, store, log)) == {}


def test_without_a_boot_time_nothing_kept_is_taken_for_this_boot():
    log, store = SimulatedKernelLog(), MemoryStore()
    first = _node(1000, store, log)
    log.write_sxid(24007, 1)
    assert _sxids(first) == {("24007", "fatal"): 1}
    blind = KernelCollector(log, PersistentState(store), MemoryTree())  # procfs without `stat`.
    blind.start()
    assert _sxids(blind) == {}


class Board:
    """Two GPUs behind NVSwitches, their kernel log and boot time, and the GPU collector watching them now."""

    def __init__(self, tmp_path, clock) -> None:
        self.clock = clock
        self.nvml = SimulatedNvml(two_boards(), clock=clock)
        self.log = SimulatedKernelLog()
        self.procfs = MemoryTree()
        self.directory = tmp_path
        self.boot(1_799_990_000)
        self.start()

    def boot(self, at: int) -> None:
        self.procfs.set("stat", f"cpu  1 2 3 4\nbtime {at}\n")

    def start(self) -> None:
        """A new exporter process, reading what the last one kept."""
        ledger = XidLedger(clock=self.clock)
        self.collector = GpuCollector(NvmlSession(self.nvml, clock=self.clock), procfs=self.procfs, xids=ledger,
                                      kernel_xids=KernelLogXids(self.log, ledger),
                                      state=PersistentState(FileStore(self.directory)))
        self.collector.start()

    def actions(self) -> dict[str, tuple[float, str]]:
        """Each GPU's action and reason after a collection, by UUID."""
        self.clock.now += 5
        samples = rendered(self.collector.collect())
        reasons = {dict(labels)["uuid"]: dict(labels)["reason"]
                   for labels in named(samples, "gpufleet_gpu_recovery_action_reason")}
        return {dict(labels)["uuid"]: (value, reasons.get(dict(labels)["uuid"], ""))
                for labels, value in named(samples, "gpufleet_gpu_recovery_action").items()}

    def reset(self, *gpus: int) -> None:
        """These GPUs leave NVML for a collection and come back, as a reset takes them off the bus."""
        for gpu in gpus:
            self.nvml.gpus[gpu].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
        self.actions()
        for gpu in gpus:
            self.nvml.gpus[gpu].errors.clear()


@pytest.fixture
def board(tmp_path, clock):
    return Board(tmp_path, clock)


RESET = float(Action.RESET)
HELD = f"fatal SXid 24007 on NVSwitch {NVSWITCH}: reset the whole board"
FREE = {UUID0: (0.0, ""), UUID1: (0.0, "")}


def test_a_fatal_sxid_holds_every_gpu_through_one_gpus_reset_until_the_whole_board_is_reset(board):
    board.actions()
    board.log.write_sxid(20001, 5)  # Non-fatal: the link's ticket, no repair.
    assert board.actions() == FREE
    board.log.write_sxid(24007, 1)
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
    board.reset(0)  # One GPU's reset mends nothing of the board's fabric.
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
    board.reset(1)  # The other one too: now every GPU of the board was reset since the error.
    assert board.actions() == FREE


def test_a_board_reset_ends_the_hold_only_once_the_fabric_registers_each_gpu_again(board):
    board.actions()
    board.log.write_sxid(24007, 1)
    board.actions()
    board.nvml.gpus[1].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    board.reset(0, 1)
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
    board.nvml.gpus[1].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert board.actions() == FREE


def test_the_hold_outlasts_an_exporter_restart_and_ends_with_the_reboot_that_registers_the_fabric(board):
    board.actions()
    board.reset(1)  # Before the error: it repairs nothing of it.
    board.log.write_sxid(24007, 2)
    board.actions()
    board.collector.close()
    board.start()  # The same boot: the kept holds, and still one GPU's reset is not the board's.
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
    board.reset(0)
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
    board.collector.close()
    board.boot(1_800_000_500)  # The node reboots; the fabric manager has not registered GPU 0 yet.
    board.nvml.gpus[0].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED
    board.start()
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
    board.nvml.gpus[0].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert board.actions() == FREE


def test_a_gpu_that_needs_more_than_a_reset_keeps_it_and_its_own_reset_joins_the_board(board):
    board.actions()
    lost = board.nvml.gpus[0]
    board.collector.xids.record_nvml(lost.index, lost.uuid, lost.pci_bus_id, 79)  # Off the bus: a reboot.
    board.collector.xids.record_nvml(1, UUID1, board.nvml.gpus[1].pci_bus_id, 62)  # A reset of its own.
    assert [action for action, _ in board.actions().values()] == [float(Action.REBOOT), RESET]
    board.log.write_sxid(24007, 1)
    assert board.actions() == {UUID0: (float(Action.REBOOT), "XID 79"), UUID1: (RESET, HELD)}
    board.reset(1)  # What would have ended its own reset does not end the board's, whose GPU 0 was not reset.
    assert board.actions()[UUID1] == (RESET, HELD)
    board.collector.close()
    board.boot(1_800_000_500)  # The reboot both need.
    board.start()
    assert board.actions() == FREE


def test_a_fatal_sxid_read_before_any_gpu_answered_holds_the_board_once_they_do(board):
    board.log.write_sxid(24007, 1)  # Read while NVML has not answered yet: a driver hung from the start.
    board.collector.held(hung=True)
    assert board.actions() == {UUID0: (RESET, HELD), UUID1: (RESET, HELD)}
