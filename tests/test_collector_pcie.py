"""The pcie collector on the fixture tree (a GPU behind a root port, a two-function HCA, NVSwitches, a GPU whose
firmware hides AER, the BMC's display controller) and on trees that break."""

from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector.pcie import PcieCollector
from gpufleet.exporter.tree import DiskTree, MemoryTree

from helpers import named, rendered

AER = "gpufleet_pcie_aer_errors_total"


def _errors(samples) -> dict[tuple[str, str], float]:
    return {(dict(labels)["address"], dict(labels)["type"]): value for labels, value in named(samples, AER).items()}


def _labels(samples, address: str) -> dict[str, str]:
    return next({k: v for k, v in labels if k != "type"} for labels in named(samples, AER)
                if dict(labels)["address"] == address)


def test_each_link_counts_its_device_and_the_port_above_it_by_type():
    collection = PcieCollector(DiskTree(FIXTURE_SYSFS)).collect()
    assert collection.problems == ()
    samples = rendered(collection)
    errors = _errors(samples)
    # GPU 0: 3 bad TLPs counted at the GPU, 40 correctable and a completion timeout at the root port above it.
    assert {t: errors["0000:18:00", t] for t in ("correctable", "nonfatal", "fatal")} == {
        "correctable": 43, "nonfatal": 1, "fatal": 0}
    assert _labels(samples, "0000:18:00") == {"address": "0000:18:00", "kind": "gpu", "bridge": "0000:17:01.0",
                                              "slot": "3"}
    # The HCA's two functions are one link: its InfiniBand and Ethernet functions' counts together.
    assert errors["0000:19:00", "correctable"] == 7
    assert _labels(samples, "0000:19:00")["kind"] == "nic"
    assert {address for address, _ in errors} == {
        "0000:05:00", "0000:06:00", "0000:07:00", "0000:08:00",  # NVSwitches.
        "0000:18:00", "0000:19:00", "0000:2a:00", "0000:3a:00", "0000:5d:00", "0000:9a:00", "0000:ab:00",
        "0000:ba:00", "0000:db:00"}  # Not the BMC's display controller (03), whatever it counts.
    assert all(_labels(samples, address)["kind"] == "nvswitch" for address in ("0000:05:00", "0000:08:00"))
    # The GPU bound to vfio-pci (e1) has no AER statistics: counted as a link that cannot be read.
    assert named(samples, "gpufleet_pcie_links_without_aer") == {frozenset(): 1}


def _tree(correctable: str) -> MemoryTree:
    tree = MemoryTree()
    base = "bus/pci/devices/0000:1b:00.0"
    tree.set(f"{base}/vendor", "0x10de")
    tree.set(f"{base}/class", "0x030200")
    tree.set(f"{base}/aer_dev_correctable", correctable)
    tree.set(f"{base}/aer_dev_nonfatal", "CmpltTO 2\nTOTAL_ERR_NONFATAL 2")
    return tree


def test_a_file_without_its_total_is_a_problem_and_its_link_is_left_out_rather_than_served_short():
    tree = _tree("RxErr 4\nBadTLP x")
    tree.set("bus/pci/devices/0000:2b:00.0/vendor", "0x15b3")
    tree.set("bus/pci/devices/0000:2b:00.0/class", "0x020700")
    tree.set("bus/pci/devices/0000:2b:00.0/aer_dev_correctable", "TOTAL_ERR_COR 6")
    collection = PcieCollector(tree).collect()
    assert collection.problems == ("bus/pci/devices/0000:1b:00.0/aer_dev_correctable: no TOTAL_ERR_COR count",)
    # A total missing a file would step down and back up, which a rate reads as new errors; a file that is
    # absent counts nothing, as it never counted anything.
    assert _errors(rendered(collection)) == {("0000:2b:00", "correctable"): 6, ("0000:2b:00", "nonfatal"): 0,
                                             ("0000:2b:00", "fatal"): 0}


def test_virtual_functions_are_their_devices_link_and_a_device_without_aer_keeps_its_ports_counts():
    tree = _tree("TOTAL_ERR_COR 5")
    vf = "devices/pci0000:1a/0000:1a:01.0/0000:1b:01.2"  # An SR-IOV VF of the device, past its eight functions.
    tree.set(f"{vf}/vendor", "0x10de")
    tree.set(f"{vf}/class", "0x030200")
    tree.set(f"{vf}/aer_dev_correctable", "TOTAL_ERR_COR 9")
    tree.link(f"{vf}/physfn", "../0000:1b:00.0")
    tree.link("bus/pci/devices/0000:1b:01.2", f"../../../{vf}")
    # A GPU without the AER capability below a root port that has it.
    gpu = "devices/pci0000:3c/0000:3c:01.0/0000:3d:00.0"
    tree.set(f"{gpu}/vendor", "0x10de")
    tree.set(f"{gpu}/class", "0x030200")
    tree.set("devices/pci0000:3c/0000:3c:01.0/aer_dev_fatal", "TOTAL_ERR_FATAL 1")
    tree.link("bus/pci/devices/0000:3d:00.0", f"../../../{gpu}")
    collection = PcieCollector(tree).collect()
    assert collection.problems == ()
    samples = rendered(collection)
    assert {address for address, _ in _errors(samples)} == {"0000:1b:00", "0000:3d:00"}
    assert _errors(samples)["0000:1b:00", "correctable"] == 5
    assert _errors(samples)["0000:3d:00", "fatal"] == 1
    assert named(samples, "gpufleet_pcie_links_without_aer") == {frozenset(): 1}


def test_a_link_out_of_the_tree_leaves_the_device_alone():
    tree = _tree("TOTAL_ERR_COR 5")
    tree.link("bus/pci/devices/0000:1c:00.0", "../../../../outside/0000:1c:00.0")
    collection = PcieCollector(tree).collect()
    assert collection.problems == ()
    assert {address for address, _ in _errors(rendered(collection))} == {"0000:1b:00"}


def test_a_node_without_pci_devices_serves_no_links():
    collection = PcieCollector(MemoryTree()).collect()
    assert collection.problems == ()
    samples = rendered(collection)
    assert named(samples, AER) == {}
    assert named(samples, "gpufleet_pcie_links_without_aer") == {frozenset(): 0}
