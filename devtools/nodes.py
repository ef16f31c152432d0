"""Nodes built by the exporter's own code over fixed hardware: the golden exposition a node serves (committed
as tests/fixtures/e2e-output.txt and diffed in review, as node_exporter's e2e-output.txt), and the benchmark's
8-GPU node that the series budget and the metric reference count.

The golden node runs over the fixture sysfs tree and simulated GPUs whose readings do not change with time,
with one XID raised, and its GPUs are collected twice, 15 s apart, so that the GPM series, which span two
collections, are there. Values that differ between runs (durations, timestamps, the Python version, the
process's own metrics) are masked.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools.paths import FIXTURE_SYSFS, FIXTURES
from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter import node
from gpufleet.exporter.collector import pcie
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.simulated.board import GpuTelemetry, SimulatedGpu, SimulatedProcess, steady
from gpufleet.exporter.gpu.simulated.host import (
    kubernetes_cgroup,
    mig_devices,
    simulated_gpus,
    simulated_procfs,
    slurm_cgroup,
)
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.tree import DiskTree
from gpufleet.simulator.kernel_log import SimulatedKernelLog

GOLDEN = FIXTURES / "e2e-output.txt"
SERIES_BUDGET = 1200  # Series an 8-GPU node may serve at the default flags: the project's budget.
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-55555555-6666-7777-8888-999999999999"
GIB = 1024**3

BUSY = GpuTelemetry(
    utilization=0.87, memory_copy_utilization=0.41, encoder_utilization=0.0, decoder_utilization=0.05,
    memory_used_bytes=40 * GIB, power_watts=612.5, energy_joules=123456.789, temperature_celsius=64,
    memory_temperature_celsius=71, sm_clock_hertz=1755e6, memory_clock_hertz=2619e6, performance_state=0,
    pcie_generation=5, pcie_width=16,
)
IDLE = GpuTelemetry(
    utilization=0.0, memory_used_bytes=512 * 1024**2, power_watts=71.25, energy_joules=9000.0,
    temperature_celsius=31, memory_temperature_celsius=36, sm_clock_hertz=345e6, memory_clock_hertz=2619e6,
    performance_state=0, pcie_generation=4, pcie_width=8, fan_speed_ratios=(0.3, 0.35),
)


def two_boards() -> list[SimulatedGpu]:
    """A busy H100 SXM board and an idle A100 PCIe board with fans, reading the same at any time."""
    return [
        SimulatedGpu(index=0, uuid=UUID0, load=steady(BUSY), serial="1650923000001", pci_bus_id="00000000:18:00.0"),
        SimulatedGpu(index=1, uuid=UUID1, load=steady(IDLE), serial="1650923000002", pci_bus_id="00000000:2A:00.0",
                     name="NVIDIA A100-PCIE-40GB", memory_total_bytes=40 * GIB, power_limit_watts=250.0,
                     unsupported=set(), gpm_supported=False),
    ]


class FakeClock:
    """A clock moved by hand: `clock.now += 1`."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# Series whose values differ between any two runs, and what they are shown as.
_VOLATILE = re.compile(r"^(gpufleet_collector_duration_seconds|gpufleet_collector_last_success_timestamp_seconds"
                       r"|gpufleet_gpu_xid_last_timestamp_seconds)(\{.*\})? .*$")


def boards() -> list[SimulatedGpu]:
    """The two boards of the GPU collector's tests, the busy one in a Slurm job with some corrected ECC errors,
    a PCIe replay rollover, an NVLink ECC error and two NVLinks (eighteen would only lengthen the file), the
    idle one held by a Kubernetes pod; and a third, another busy H100 in MIG mode with two GPU instances, a
    Slurm job in the first."""
    busy, idle = two_boards()
    busy.ecc_errors = {("corrected", "volatile"): 3, ("corrected", "aggregate"): 12}
    busy.pcie_replay_rollovers = busy.nvlink_ecc_errors = 1  # Their series exist from the first error on.
    busy.nvlinks, idle.nvlinks = 2, 0
    busy.processes = [SimulatedProcess(4101, slurm_cgroup(4242, 0))]
    idle.processes = [SimulatedProcess(4102, kubernetes_cgroup("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "c" * 64))]
    split = SimulatedGpu(index=2, uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", load=busy.load, nvlinks=0,
                         serial="1650923000003", pci_bus_id="00000000:3A:00.0",
                         mig=mig_devices("golden", ["4g.40gb", "3g.40gb"]),
                         processes=[SimulatedProcess(4103, slurm_cgroup(4243, 0), gpu_instance=1)])
    return [busy, idle, split]


def masked(body: str) -> str:
    """An exposition with what differs between runs masked, and the process's own families left out."""
    lines = []
    for line in body.splitlines():
        if re.match(r"^(# (HELP|TYPE) )?process_", line):
            continue  # prometheus_client's own process metrics: they exist on Linux only, with values of the run.
        line = _VOLATILE.sub(r"\1\2 <varies>", line)
        lines.append(re.sub(r'python_version="[^"]*"', 'python_version="<python>"', line))
    return "\n".join(lines) + "\n"


def served(gpus: list[SimulatedGpu], sysfs: Path, flags: argparse.Namespace, xids: Sequence[tuple[int, int]] = (),
           collections: int = 2, sxids: Sequence[int] = (), storage_timeouts: int = 0) -> str:
    """What a node of the exporter's own collectors over these boards and sysfs tree serves on /metrics once each
    collector has run and the GPUs have been collected `collections` times, 15 s apart (GPM reports the interval
    between two); with `xids` (each a GPU and a code) raised and counted first, and `sxids` (codes the simulator
    writes) and `storage_timeouts` (NFS timeouts) in its kernel log."""
    clock = FakeClock(1000.0)
    nvml = SimulatedNvml(gpus, clock=clock)
    kernel_log = SimulatedKernelLog()
    hardware = Hardware(nvml, DiskTree(sysfs), simulated_procfs(gpus), nvml_event_wait_ms=50, kernel_log=kernel_log)
    collectors = node.build(flags, hardware)
    [gpu] = [c for c in collectors if c.name == "gpu"]
    try:
        for collector in collectors:
            collector.start()
        for code in sxids:
            kernel_log.write_sxid(code, 1)
        kernel_log.write("storage_timeout", storage_timeouts)
        if xids and isinstance(gpu.collector, GpuCollector):
            ledger = gpu.collector.xids
            wait_for(lambda: ledger.watching, 10, "the XID watcher's registration")
            for xid in xids:
                nvml.inject_xid(*xid)
            wait_for(lambda: len(ledger.snapshot()) == len(set(xids)), 10, "the XIDs in the ledger")
        for collector in collectors:
            collector.collect_now()
        for _ in range(collections - 1):
            clock.now += 15
            gpu.collect_now()
        return Exposition(collectors, state=hardware.state).body().decode()
    finally:
        node.close(collectors)


def golden_exposition() -> str:
    """The committed golden file's text: every GPM series there, the opt-in ones too, and one XID counted."""
    flags = node.defaults()
    flags.gpu_gpm_detail = True
    return masked(served(boards(), FIXTURE_SYSFS, flags, xids=[(0, 31)]))


def bench_node(flags: argparse.Namespace | None = None) -> str:
    """What the benchmark's node serves: 8 simulated H100s over the tree `write_bench_sysfs` writes, at the
    exporter's default flags unless `flags` says otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        write_bench_sysfs(Path(tmp))
        return served(simulated_gpus(8), Path(tmp), flags or node.defaults())


def catalogue_exposition(flags: argparse.Namespace) -> str:
    """The golden node with every state that makes a sparse family appear: an NVLink down and one that counted
    errors, a MIG mode pending its reset, a port whose link_downed counter stopped at its maximum, a contained
    memory error whose reset waits for the next drain. With every opt-in flag on, it serves every family the
    exporter has."""
    gpus = boards()
    busy, contained, split = gpus
    busy.nvlinks_down = {1}
    busy.nvlink_errors = {(0, "crc_flit"): 5}
    split.mig_pending = False
    contained.ecc_errors = {("uncorrected", "volatile"): 1, ("uncorrected", "aggregate"): 1}
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = Path(tmp) / "sys"
        shutil.copytree(FIXTURE_SYSFS, sysfs, symlinks=True)
        (sysfs / "class/infiniband/mlx5_1/ports/1/counters/link_downed").write_text("255\n")
        return served(gpus, sysfs, flags, xids=[(0, 31), (1, 94)], sxids=[24007, 20001], storage_timeouts=1)


def series_by_family(text: str) -> Counter[str]:
    """Series per metric family of an exposition."""
    return Counter({family.name: len(family.samples) for family in text_string_to_metric_families(text)})


def write_bench_sysfs(root: Path) -> None:
    """The benchmark node's sysfs tree under `root`: 8 InfiniBand ports, 4 Ethernet interfaces, 32 hwmon sensors,
    and on the PCI bus 8 GPUs and 8 HCAs, each below a switch port, and 4 NVSwitches, every one with AER."""

    def write(relative: str, value: object) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")

    for index in range(8):
        device = f"mlx5_{index}"
        for name, value in (("board_id", "MT_0000000838"), ("fw_ver", "28.39.1002"), ("hca_type", "MT4129"),
                            ("node_guid", f"946d:ae03:008a:1b{index:02x}")):
            write(f"class/infiniband/{device}/{name}", value)
        port = f"class/infiniband/{device}/ports/1"
        write(f"{port}/rate", "400 Gb/sec (4X NDR)")
        write(f"{port}/state", "4: ACTIVE")
        write(f"{port}/phys_state", "5: LinkUp")
        write(f"{port}/link_layer", "InfiniBand")
        for counter in ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait",
                        "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
                        "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                        "excessive_buffer_overrun_errors", "VL15_dropped", "unicast_xmit_packets",
                        "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets"):
            write(f"{port}/counters/{counter}", 123456789 + index)
        for counter in ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "duplicate_request",
                        "rnr_nak_retry_err", "packet_seq_err", "implied_nak_seq_err"):
            write(f"{port}/hw_counters/{counter}", index)
    for index in range(4):
        device = f"eth{index}"
        for stat in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
                     "tx_dropped", "multicast", "collisions", "rx_crc_errors", "rx_missed_errors"):
            write(f"class/net/{device}/statistics/{stat}", 987654321 + index)
        settings: tuple[tuple[str, object], ...] = (
            ("speed", 100000), ("operstate", "up"), ("carrier_changes", 2), ("mtu", 9000),
            ("address", f"b4:96:91:a1:22:{index:02x}"), ("duplex", "full"))
        for attribute, setting in settings:
            write(f"class/net/{device}/{attribute}", setting)
    for chip in range(2):
        hwmon = f"class/hwmon/hwmon{chip}"
        write(f"{hwmon}/name", "coretemp")
        for sensor in range(1, 17):
            write(f"{hwmon}/temp{sensor}_input", 40000 + sensor * 500)
            write(f"{hwmon}/temp{sensor}_label", f"Core {sensor - 1}")
            write(f"{hwmon}/temp{sensor}_max", 84000)
            write(f"{hwmon}/temp{sensor}_crit", 100000)
    _write_pci_bus(root, write)


def _write_pci_bus(root: Path, write: Callable[[str, object], None]) -> None:
    """The bench node's PCI devices: each GPU and HCA below a port of its own, as an HGX board's PCIe switches
    place them, linked from `bus/pci/devices` as sysfs links them; the NVSwitches as plain entries."""
    def device(address: str, vendor: str, pci_class: str, where: str) -> None:
        for name, value in (("vendor", vendor), ("class", pci_class)):
            write(f"{where}/{name}", value)
        for file, total in pcie.TYPES.values():
            write(f"{where}/{file}", f"{total} 0")
        if where != f"bus/pci/devices/{address}":
            (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
            (root / "bus/pci/devices" / address).symlink_to(f"../../../{where}")

    for index in range(16):
        bus = 0x12 + 0x0c * index
        port = f"devices/pci0000:{bus - 2:02x}/0000:{bus - 2:02x}:01.0/0000:{bus - 1:02x}:00.0"
        device(f"0000:{bus - 1:02x}:00.0", "0x1000", "0x060400", port)  # The switch port above.
        vendor, pci_class = ("0x10de", "0x030200") if index < 8 else ("0x15b3", "0x020700")
        device(f"0000:{bus:02x}:00.0", vendor, pci_class, f"{port}/0000:{bus:02x}:00.0")
    for index in range(4):
        device(f"0000:{5 + index:02x}:00.0", "0x10de", "0x068000", f"bus/pci/devices/0000:{5 + index:02x}:00.0")
