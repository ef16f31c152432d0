"""The recovery action each GPU needs (`gpufleet_gpu_recovery_action`), raised by what the hardware reports and
held until what fixes it is seen, across exporter restarts, a driver that hangs and reboots that bring no GPU back;
asserted on what the GPU collector exports.

Two simulated boards behind the production session; XIDs enter the ledger as the NVML event watcher enters
them; the node's boot time is procfs `stat`; the kept state is a real file in a temporary directory.
"""

from __future__ import annotations

import json
import logging

import pynvml
import pytest

from gpufleet.devtools.nodes import UUID0, UUID1, FakeClock, two_boards
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.xid import KernelLogXids, XidLedger
from gpufleet.exporter.kernellog import DevKmsg
from gpufleet.exporter.state import FILE, FileStore, PersistentState
from gpufleet.exporter.tree import MemoryTree
from gpufleet.xid import Action

from helpers import named, rendered, series

BOOT = 1_799_990_000
LOST = pynvml.NVML_ERROR_GPU_IS_LOST
LOST_DRIVER = pynvml.NVML_ERROR_DRIVER_NOT_LOADED


class Node:
    """One node's boards, boot time and state directory, and the exporter process watching them now."""

    def __init__(self, tmp_path, clock: FakeClock) -> None:
        self.clock = clock
        self.nvml = SimulatedNvml(two_boards(), clock=clock)
        self.procfs = MemoryTree()
        self.boot(BOOT)
        self.directory = tmp_path
        self.start()

    def boot(self, at: int) -> None:
        self.procfs.set("stat", f"cpu  1 2 3 4\nbtime {at}\nprocesses 10\n")

    def start(self) -> None:
        """A new exporter process, reading what the last one kept."""
        self.state = PersistentState(FileStore(self.directory))
        self.ledger = XidLedger(clock=self.clock)
        self.collector = GpuCollector(NvmlSession(self.nvml, clock=self.clock), procfs=self.procfs,
                                      xids=self.ledger, state=self.state)

    def xid(self, gpu: int, code: int) -> None:
        board = self.nvml.gpus[gpu]
        self.ledger.record_nvml(board.index, board.uuid, board.pci_bus_id, code)

    def verdict(self, gpu: int, action: int) -> None:
        """The driver's recovery action as its NVML event announced it, between two collections."""
        self.ledger.record_verdict(self.nvml.gpus[gpu].uuid, action)

    def actions(self) -> dict[str, float]:
        """Each GPU's action after a collection, by UUID."""
        self.clock.now += 15
        samples = rendered(self.collector.collect())
        return {dict(labels)["uuid"]: value for labels, value in named(samples, "gpufleet_gpu_recovery_action").items()}

    def reasons(self) -> dict[str, str]:
        samples = rendered(self.collector.collect())
        return {dict(labels)["uuid"]: dict(labels)["reason"]
                for labels in named(samples, "gpufleet_gpu_recovery_action_reason")}


@pytest.fixture
def node(tmp_path, clock):
    return Node(tmp_path, clock)


NONE, DRAIN, RESET, REBOOT, REPLACE = (float(a) for a in Action)


def test_every_gpu_has_one_series_whose_value_is_the_action(node):
    assert node.actions() == {UUID0: NONE, UUID1: NONE}
    assert node.reasons() == {}


def test_an_xid_that_needs_a_reset_is_held_until_the_gpu_leaves_nvml_and_comes_back(node):
    node.actions()
    node.xid(0, 62)
    assert node.actions() == {UUID0: RESET, UUID1: NONE}
    assert node.reasons() == {UUID0: "XID 62"}
    node.clock.now += 3600  # No window: an hour later it still needs its reset.
    assert node.actions()[UUID0] == RESET
    node.nvml.gpus[0].errors["*"] = LOST  # While the reset takes it off the bus.
    assert node.actions()[UUID0] == RESET
    node.nvml.gpus[0].errors.clear()
    assert node.actions() == {UUID0: NONE, UUID1: NONE}


def test_a_double_bit_error_is_held_until_a_reset_clears_the_volatile_count(node):
    node.actions()
    board = node.nvml.gpus[1]
    board.ecc_errors = {("uncorrected", "volatile"): 1, ("uncorrected", "aggregate"): 1}
    assert node.actions()[UUID1] == NONE  # Waiting for an XID that would say the error was contained.
    node.clock.now += 15
    assert node.actions()[UUID1] == RESET
    node.clock.now += 3600
    assert node.actions()[UUID1] == RESET
    board.ecc_errors = {("uncorrected", "volatile"): 0, ("uncorrected", "aggregate"): 1}
    assert node.actions()[UUID1] == NONE


def deferred(node) -> set[str]:
    """The UUIDs whose held action waits for the next drain, after a collection."""
    samples = rendered(node.collector.collect())
    return {dict(labels)["uuid"] for labels, value in named(samples, "gpufleet_gpu_recovery_action_deferred").items()
            if value == 1}


def test_a_contained_memory_error_defers_its_reset_to_the_next_drain_until_an_uncontained_one_comes(node):
    """XID 94 with the uncorrectable count: a reset at the next drain (a ticket). A count read with no memory XID
    waits for one, is urgent after that, and deferred once a late XID 94 comes; an XID 95 makes it
    urgent again; and once repaired, the GPU's next error is judged afresh."""
    node.actions()
    board = node.nvml.gpus[0]
    board.ecc_errors = {("uncorrected", "volatile"): 1, ("uncorrected", "aggregate"): 1}
    assert node.actions()[UUID0] == NONE
    node.clock.now += 15  # Past the wait for its XID, twice the ledger's deduplication window.
    assert node.actions()[UUID0] == RESET and deferred(node) == set()  # Its XID 94 not told yet: urgent.
    node.xid(0, 94)
    assert node.actions()[UUID0] == RESET and deferred(node) == {UUID0}
    assert node.reasons()[UUID0] == "a contained uncorrectable ECC error (XID 94): reset at the next drain"
    node.start()  # Kept across a restart.
    assert node.actions()[UUID0] == RESET and deferred(node) == {UUID0}
    node.xid(0, 95)
    assert node.actions()[UUID0] == RESET and deferred(node) == set() and node.reasons()[UUID0] == "XID 95"
    board.ecc_errors = {("uncorrected", "volatile"): 0, ("uncorrected", "aggregate"): 1}
    assert node.actions()[UUID0] == NONE
    node.xid(1, 94)
    node.nvml.gpus[1].ecc_errors = {("uncorrected", "volatile"): 2, ("uncorrected", "aggregate"): 2}
    board.ecc_errors = {("uncorrected", "volatile"): 1, ("uncorrected", "aggregate"): 2}
    assert node.actions() == {UUID0: NONE, UUID1: RESET} and deferred(node) == {UUID1}
    node.clock.now += 15
    assert node.actions() == {UUID0: RESET, UUID1: RESET} and deferred(node) == {UUID1}


def test_the_drivers_own_verdict_is_read_and_its_none_afterwards_ends_it(node):
    node.actions()
    board = node.nvml.gpus[0]
    board.recovery_action = 3  # DRAIN_P2P
    assert node.actions()[UUID0] == DRAIN
    board.recovery_action = 2  # NODE_REBOOT: the larger action replaces the smaller.
    assert node.actions()[UUID0] == REBOOT
    board.recovery_action = 0  # A reboot is seen by the boot time, not by the driver changing its mind.
    assert node.actions()[UUID0] == REBOOT
    node.boot(BOOT + 7200)
    assert node.actions()[UUID0] == NONE

    board.recovery_action = 1  # GPU_RESET, then none: the reset was done.
    assert node.actions()[UUID0] == RESET
    board.recovery_action = 0
    assert node.actions()[UUID0] == NONE


def test_a_verdict_the_driver_announced_between_collections_is_held_as_if_read(node, caplog):
    node.actions()
    node.verdict(1, 3)  # DRAIN_P2P, announced by its event; the field reads it too from now on.
    node.nvml.gpus[1].recovery_action = 3
    assert node.actions() == {UUID0: NONE, UUID1: DRAIN}
    node.clock.now += 3600
    assert node.actions()[UUID1] == DRAIN

    caplog.set_level(logging.INFO, logger="gpufleet.exporter.collector.gpu")
    node.verdict(0, 1)  # GPU_RESET, then none before the next collection: the reset was done in between.
    node.verdict(0, 0)
    assert node.actions() == {UUID0: NONE, UUID1: DRAIN}
    assert [r.getMessage() for r in caplog.records if UUID0 in r.getMessage()] == [
        f"GPU 0 ({UUID0}) needs reset: the driver asks for it (action 1)",
        f"GPU 0 ({UUID0}) no longer needs reset: the driver asks for nothing any more"]


def test_a_verdict_announced_while_a_collection_reads_is_acted_on_after_that_reading(node, monkeypatch, caplog):
    """The reading of this collection is older than the verdict: applying the verdict first would let the stale
    reading of none settle it at once, and the next raise it again."""
    node.actions()
    sample = node.collector.session.sample

    def sample_then_verdict():
        taken = sample()
        node.nvml.gpus[0].recovery_action = 1
        node.verdict(0, 1)
        return taken
    monkeypatch.setattr(node.collector.session, "sample", sample_then_verdict)
    caplog.set_level(logging.INFO, logger="gpufleet.exporter.collector.gpu")
    assert node.actions()[UUID0] == NONE
    assert node.actions()[UUID0] == RESET
    assert [r.getMessage() for r in caplog.records if UUID0 in r.getMessage()] == [
        f"GPU 0 ({UUID0}) needs reset: the driver asks for it (action 1)"]


def test_a_verdict_given_just_before_the_gpu_fell_off_the_bus_is_held(node):
    node.actions()
    node.verdict(0, 2)  # NODE_REBOOT, and the GPU is gone before the next collection reads it.
    node.nvml.gpus[0].errors["*"] = LOST
    assert node.actions()[UUID0] == REBOOT


def test_a_gpu_off_the_bus_needs_a_reboot_which_a_reset_does_not_end(node):
    node.actions()
    node.xid(0, 79)
    node.nvml.gpus[0].errors["*"] = LOST
    assert node.actions()[UUID0] == REBOOT
    node.nvml.gpus[0].errors.clear()
    assert node.actions()[UUID0] == REBOOT
    node.boot(BOOT + 600)
    assert node.actions()[UUID0] == NONE


def test_a_failed_row_remap_needs_another_board_and_outlasts_reboots(node):
    node.actions()
    node.nvml.gpus[0].row_remap_failed = True
    node.xid(0, 64)
    assert node.actions()[UUID0] == REPLACE
    assert node.reasons()[UUID0] in ("a row remap failed", "XID 64")
    node.boot(BOOT + 600)
    node.start()
    assert node.actions()[UUID0] == REPLACE
    # The board is swapped during a reboot: the same slot, another UUID, none of the old board's errors.
    node.nvml.gpus[0].uuid = "GPU-99999999-0000-0000-0000-000000000000"
    node.nvml.gpus[0].row_remap_failed = False
    node.boot(BOOT + 1200)
    node.start()
    assert node.actions() == {"GPU-99999999-0000-0000-0000-000000000000": NONE, UUID1: NONE}


def test_an_exporter_killed_between_two_xids_keeps_their_counts_and_the_action(node, tmp_path):
    node.actions()
    node.xid(0, 62)
    assert node.actions()[UUID0] == RESET
    node.start()  # What kill -9 leaves: the file as of the last collection, no orderly shutdown.
    node.xid(0, 62)
    samples = rendered(node.collector.collect())
    assert samples[series("gpufleet_gpu_xid_errors_total", gpu="0", uuid=UUID0, xid="62")] == 2
    assert samples[series("gpufleet_gpu_recovery_action", gpu="0", uuid=UUID0)] == RESET
    assert [s.value for s in node.state.families()[0].samples] == [1.0, 1.0]  # Loaded, and saved.
    kept = json.loads((tmp_path / FILE).read_text())
    assert kept["sections"]["gpu"]["xids"][0]["count"] == 2


def test_a_restart_does_not_act_again_on_xids_already_acted_on(node):
    node.actions()
    node.xid(0, 62)
    node.actions()
    node.nvml.gpus[0].errors["*"] = LOST
    node.actions()
    node.nvml.gpus[0].errors.clear()
    assert node.actions()[UUID0] == NONE  # Reset.
    node.start()
    assert node.actions()[UUID0] == NONE


@pytest.mark.parametrize("content", [
    '{"version": 1, "sections": {"gpu": {"xids": [{"uuid": "GPU-', # Truncated by a full disk.
    "\x00\x00\x00\x00",
    '{"version": 99, "sections": {}}',
    '{"version": 1, "sections": ["gpu"]}',
    '["a list"]',
])
def test_an_unreadable_state_file_starts_empty_with_one_line_and_a_metric(node, tmp_path, caplog, content):
    (tmp_path / FILE).write_text(content)
    with caplog.at_level(logging.WARNING):
        node.start()
        samples = rendered(node.collector.collect())
    families = {f.name: f for f in node.state.families()}
    assert [s.value for s in families["gpufleet_exporter_state_ok"].samples] == [0.0, 1.0]  # load, save
    assert samples[series("gpufleet_gpu_recovery_action", gpu="0", uuid=UUID0)] == NONE
    assert len([r for r in caplog.records if "state" in r.getMessage()]) == 1
    assert json.loads((tmp_path / FILE).read_text())["version"] == 1  # Replaced by a good one.


def test_entries_of_the_wrong_kind_beside_a_good_inventory_are_dropped_and_the_rest_is_served(node, tmp_path):
    """The kept state applies when the collector is built, where the file names the node's GPUs: an entry that is
    not a record (a hand-edited or half-written file) is counted as ignored, never a start that fails."""
    node.actions()
    node.xid(1, 62)
    node.actions()
    data = json.loads((tmp_path / FILE).read_text())
    data["sections"]["gpu"]["xids"] += ["GPU-1", 62, None, {"uuid": UUID1, "xid": [62], "count": 1, "last": 0}]
    data["sections"]["gpu"]["actions"]["0000:99:00.0"] = "reset"
    (tmp_path / FILE).write_text(json.dumps(data))
    node.start()
    first = rendered(node.collector.held(hung=False))
    assert first[series("gpufleet_gpu_recovery_action", gpu="1", uuid=UUID1)] == RESET
    assert {f.name: f.samples[0].value for f in node.state.families()}["gpufleet_exporter_state_ignored_entries"] == 5


def test_a_state_file_of_another_hosts_gpus_is_not_applied_to_these(node, tmp_path):
    node.actions()
    node.xid(0, 79)
    node.actions()
    kept = (tmp_path / FILE).read_text()
    other = tmp_path / "other"
    other.mkdir()
    (other / FILE).write_text(kept.replace(UUID0, "GPU-77777777-0000-0000-0000-000000000000"))
    node.directory = other
    node.start()
    samples = rendered(node.collector.collect())
    assert samples[series("gpufleet_gpu_recovery_action", gpu="0", uuid=UUID0)] == NONE
    assert not named(samples, "gpufleet_gpu_xid_errors_total")
    assert {f.name: f.samples[0].value for f in node.state.families()}["gpufleet_exporter_state_ignored_entries"] == 2


def test_a_state_directory_that_does_not_exist_yet_is_made(tmp_path, clock):
    node = Node(tmp_path / "var" / "lib" / "gpufleet-exporter", clock)
    node.actions()
    node.xid(0, 62)
    node.actions()
    assert [s.value for s in node.state.families()[0].samples] == [1.0, 1.0]
    assert (tmp_path / "var" / "lib" / "gpufleet-exporter" / FILE).exists()


def test_a_restarted_exporter_serves_the_held_actions_before_its_first_collection(node):
    """A scrape in the first second after a start finds each held action, from the state file: the page of a GPU
    that still needs its reset must not resolve because the exporter restarted."""
    node.actions()
    node.xid(1, 62)
    assert node.actions()[UUID1] == RESET
    node.start()
    first = rendered(node.collector.held(hung=False))
    assert named(first, "gpufleet_gpu_recovery_action") == {
        frozenset({("gpu", "0"), ("uuid", UUID0)}): NONE, frozenset({("gpu", "1"), ("uuid", UUID1)}): RESET}
    assert first[series("gpufleet_gpu_xid_errors_total", gpu="1", uuid=UUID1, xid="62")] == 1
    assert first[series("gpufleet_gpu_driver_up")] == 0  # Not answered yet: the node's other GPU pages are held.
    assert node.actions()[UUID1] == RESET  # And the first collection carries it on.


def test_a_hung_driver_keeps_the_held_actions_and_its_xids_reach_them_from_the_kernel_log(node, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    node.collector.kernel_xids = KernelLogXids(DevKmsg(str(kmsg)), node.ledger)
    node.collector.start()
    node.actions()
    node.xid(0, 62)
    assert node.actions()[UUID0] == RESET
    # NVML stops answering: every collection from now on times out, and the scheduler serves `held` instead.
    hung = rendered(node.collector.held(hung=True))
    assert hung[series("gpufleet_gpu_driver_up")] == 0
    assert hung[series("gpufleet_gpu_recovery_action", gpu="0", uuid=UUID0)] == RESET
    assert not named(hung, "gpufleet_gpu_up") and not named(hung, "gpufleet_gpu_power_watts")  # Nothing stale.
    with kmsg.open("a") as log:  # The GSP timeout reaches the kernel log only: NVML delivers no event.
        log.write("NVRM: Xid (PCI:0000:2a:00): 119, pid=4242, name=python3, Timeout after 6s of waiting for RPC "
                  "response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL).\n")
    node.collector.held(hung=True)
    node.clock.now += 15  # Past the window in which an NVML event for the same XID would have counted it instead.
    hung = rendered(node.collector.held(hung=True))
    assert hung[series("gpufleet_gpu_xid_errors_total", gpu="1", uuid=UUID1, xid="119")] == 1
    assert hung[series("gpufleet_gpu_recovery_action", gpu="1", uuid=UUID1)] == RESET
    # The driver answers again without a reset: nothing was repaired, and both GPUs stay held.
    samples = rendered(node.collector.collect())
    assert samples[series("gpufleet_gpu_driver_up")] == 1
    assert samples[series("gpufleet_gpu_xid_errors_total", gpu="1", uuid=UUID1, xid="119")] == 1
    assert node.actions() == {UUID0: RESET, UUID1: RESET}


@pytest.mark.parametrize("gone", ["listed but lost", "not listed"])
def test_a_reboot_that_does_not_bring_the_gpu_back_repairs_nothing(node, gone):
    node.actions()
    node.xid(0, 79)
    node.nvml.gpus[0].errors["*"] = LOST
    assert node.actions()[UUID0] == REBOOT
    board = node.nvml.gpus[0]
    if gone == "not listed":  # Off the bus after the reboot: NVML enumerates one GPU fewer.
        node.nvml.gpus.remove(board)
        node.nvml.gpus[0].index = 0
    node.boot(BOOT + 600)
    node.start()  # The reboot's new exporter process, which only its state file tells what the node had.
    samples = rendered(node.collector.collect())
    assert samples[series("gpufleet_gpu_up", gpu="0", uuid=UUID0)] == 0
    assert samples[series("gpufleet_gpu_recovery_action", gpu="0", uuid=UUID0)] == REBOOT
    assert node.reasons()[UUID0] == "XID 79; still lost after a reboot"
    node.start()  # Restarted again: still remembered, still held.
    assert node.actions()[UUID0] == REBOOT
    if gone == "not listed":
        node.nvml.gpus.insert(0, board)
        node.nvml.gpus[1].index = 1
    board.errors.clear()
    node.boot(BOOT + 1200)  # A reboot that brings it back is the repair.
    node.start()
    assert node.actions() == {UUID0: NONE, UUID1: NONE}


def test_a_gpu_declared_taken_out_is_forgotten_and_one_not_declared_stays_lost(node, tmp_path):
    node.actions()
    node.nvml.gpus.pop()  # GPU 1 taken out during a reboot.
    node.boot(BOOT + 600)
    node.start()
    assert rendered(node.collector.collect())[series("gpufleet_gpu_up", gpu="1", uuid=UUID1)] == 0
    node.collector = GpuCollector(NvmlSession(node.nvml, clock=node.clock), procfs=node.procfs, xids=node.ledger,
                                  state=PersistentState(FileStore(tmp_path)), expected_count=1)
    samples = rendered(node.collector.collect())
    assert named(samples, "gpufleet_gpu_up") == {frozenset({("gpu", "0"), ("uuid", UUID0)}): 1.0}
    assert UUID1 not in json.dumps(json.loads((tmp_path / FILE).read_text())["sections"]["gpu"]["gpus"])


def test_nvml_down_from_the_start_serves_the_kept_actions_and_every_gpu_lost(node):
    node.actions()
    node.xid(1, 62)
    assert node.actions()[UUID1] == RESET
    node.nvml.init_error = LOST_DRIVER  # The driver did not load after a restart (an upgrade that failed).
    node.start()
    samples = rendered(node.collector.collect())
    assert samples[series("gpufleet_gpu_recovery_action", gpu="1", uuid=UUID1)] == RESET
    assert set(named(samples, "gpufleet_gpu_up").values()) == {0.0} and len(named(samples, "gpufleet_gpu_up")) == 2
    assert samples[series("gpufleet_gpu_driver_up")] == 0
