"""NVSwitch SXids: the driver's lines read as it writes them, counted once per error by the kernel collector, and
kept across an exporter's restart until the node boots again."""

from gpufleet.exporter.collector.kernel import KernelCollector
from gpufleet.exporter.state import MemoryStore, PersistentState
from gpufleet.exporter.sxid import Sxid, parse_sxid
from gpufleet.exporter.tree import MemoryTree
from gpufleet.simulator.kernel_log import SimulatedKernelLog

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
