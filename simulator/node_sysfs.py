"""The sysfs tree of a simulated node: InfiniBand and Ethernet ports, hwmon chips, a thermal zone, PCI devices.

Every counter file is a function of the node's frozen clock, read when the
collector opens it: traffic follows the job's phases and the faults on the port
(saturation, links down or flapping, congestion, symbol errors), and the node's
power meter adds a modelled host to its boards' own draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpufleet.exporter.collector.infiniband import NARROW_COUNTERS
from gpufleet.exporter.collector.pcie import TYPES as AER_TYPES
from gpufleet.exporter.gpu.simulated.board import SimulatedGpu
from gpufleet.exporter.tree import MemoryTree
from gpufleet.simulator.faults import Cause
from gpufleet.simulator.faults import FaultKind as Kind
from gpufleet.simulator.node_state import NodeState
from gpufleet.simulator.timeline import integral, overlap
from gpufleet.simulator.workload import Workload, blocked, network, wave

IB_PORTS = tuple(f"mlx5_{i}/1" for i in range(8))
ETHERNET = {"eth0": 25_000, "eth1": 100_000}  # Mb/s: management and storage networks.
IB_BYTES_PER_SECOND = 400 * 125_000_000  # NDR, 400 Gb/s.
# With the fleet's storage_hca: a ConnectX-6 at HDR (200 Gb/s) to the storage fabric, of another model and
# slower than the training HCAs by design, reading training data at a steady share of its link.
STORAGE_PORT = "mlx5_8/1"
STORAGE_BYTES_PER_SECOND = 200 * 125_000_000
_STORAGE_SHARE = 0.04
# Board, firmware and model of each kind of HCA.
_TRAINING_HCA = (("board_id", "MT_0000000838"), ("fw_ver", "28.39.1002"), ("hca_type", "MT4129"))
_STORAGE_HCA = (("board_id", "MT_0000000594"), ("fw_ver", "20.39.1002"), ("hca_type", "MT4123"))
# port_xmit_wait ticks per second a port counts while it waits to send: the tick is the HCA's own.
_WAIT_TICKS_PER_SECOND = 150e6
# The host beside the GPUs (CPUs, NICs, fans, drives), modelled rather than measured; the cap is a DGX H100's
# published 10.2 kW system maximum.
NODE_HOST_WATTS = 1400.0
NODE_HOST_BUSY_WATTS = 1000.0
NODE_POWER_CAP_WATTS = 10200.0
_FOREVER = math.inf
# The error names of the kernel's AER statistics files, before their total line, in its order.
_AER_NAMES = {
    "correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"),
    "uncorrectable": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                      "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                      "PoisonTLPBlocked"),
}
# Which error of its file a pcie_aer fault counts: a bad link's replays time out, and a request goes unanswered.
_AER_FAULT_ERRORS = {"correctable": "Timeout", "nonfatal": "CmpltTO"}


def _text(read: Callable[..., object], *args: object) -> Callable[[], str]:
    """A file whose content is `read(*args)` at the moment it is read."""
    return lambda: str(read(*args))


def _narrow(name: str, read: Callable[..., int], *args: object) -> int:
    """A count as an IBA error counter of its width holds it: stopped at its maximum."""
    return min(int(read(*args)), (1 << NARROW_COUNTERS[name]) - 1)


class NodeSysfs:
    """Fills one node's sysfs tree with files whose contents follow its workload and faults."""

    def __init__(self, state: NodeState, workload: Workload, boards: list[SimulatedGpu], tree: MemoryTree,
                 storage_hca: bool = False) -> None:
        self.state = state
        self.workload = workload
        self.boards = boards
        self.tree = tree
        self.ib_ports = IB_PORTS + ((STORAGE_PORT,) if storage_hca else ())
        self._network_at: tuple[float, float] = (-1.0, 0.0)
        self._ib_high: dict[tuple[str, str], tuple[float, int]] = {}  # (port, direction) -> (when, count) served
        self._build_sysfs()

    def _network_integral(self) -> float:
        """Link-rate seconds of traffic so far; every port file of one instant reads the same, computed once."""
        at, value = self._network_at
        if at != self.state.t:
            value = integral(self.workload.segments(), network, self.state.t)
            self._network_at = (self.state.t, value)
        return value

    def ib_bytes(self, port: str, direction: str) -> int:
        """Bytes through an InfiniBand port: the job's traffic, raised by saturation, stopped while down. The
        storage HCA's is a steady share of its link while it is up."""
        if port == STORAGE_PORT:
            down = sum(overlap(f.start, f.end, self.state.t) for f in self.state.links_down(port))
            return int(_STORAGE_SHARE * STORAGE_BYTES_PER_SECOND * (self.state.t - down))
        total = IB_BYTES_PER_SECOND * self._network_integral()
        for fault in self.state.active(Kind.NIC_SATURATION, port=port):
            if fault.direction == direction:
                total += IB_BYTES_PER_SECOND * (fault.size * overlap(fault.start, fault.end, self.state.t)
                                                - self.workload.window_integral(fault, network))
        for fault in self.state.links_down(port):
            total -= IB_BYTES_PER_SECOND * self.workload.window_integral(fault, network)
        for fault in self.state.active(Kind.IB_LINK_FLAP, port=port):
            total -= 0.5 * IB_BYTES_PER_SECOND * self.workload.window_integral(fault, network)
        # While a port is down its count is a difference of integrals, which rounding moves by a byte either way
        # when a fault elsewhere splits the timeline; a hardware counter never steps back (Prometheus would read
        # a reset, and the whole count as one interval's traffic), so neither does this one as time goes on.
        value, key = int(max(0.0, total)), (port, direction)
        at, high = self._ib_high.get(key, (-_FOREVER, 0))
        if self.state.t >= at:
            value = max(value, high)
            self._ib_high[key] = (self.state.t, value)
        return value

    def ib_down(self, port: str) -> bool:
        t = self.state.t
        if any(f.active(t) for f in self.state.links_down(port)):
            return True
        flaps = self.state.active(Kind.IB_LINK_FLAP, port=port)
        return any(f.active(t) and (t - f.start) % f.size < f.size / 2 for f in flaps)  # Down the first half.

    def ib_link_downed(self, port: str) -> int:
        t = self.state.t
        downs = sum(1 for f in self.state.links_down(port) if f.start <= t)
        for fault in self.state.active(Kind.IB_LINK_FLAP, port=port):
            window = overlap(fault.start, fault.end, t)
            downs += math.ceil(window / fault.size) if window > 0 else 0
        return downs

    def _ib_rate(self, port: str) -> str:
        degraded = any(f.active(self.state.t) for f in self.state.active(Kind.IB_RATE_DEGRADED, port=port))
        if port == STORAGE_PORT:
            return "100 Gb/sec (2X HDR)" if degraded else "200 Gb/sec (4X HDR)"
        return "200 Gb/sec (4X HDR)" if degraded else "400 Gb/sec (4X NDR)"

    def _ib_xmit_wait(self, port: str) -> int:
        ticks = int(20_000 * self._network_integral()) + self.state.counted(Kind.IB_CONGESTION, port=port)
        if port == self._congested_port():
            ticks += int(_WAIT_TICKS_PER_SECOND * integral(self.workload.segments(), blocked, self.state.t))
        return ticks

    def _congested_port(self) -> str | None:
        """The port a NIC straggler congests: its own, or the node's first InfiniBand port. Only one per node,
        so the waiting its timeline records is counted once."""
        stragglers = self.state.active(Kind.STRAGGLER, cause=Cause.NIC)
        return (stragglers[0].port or IB_PORTS[0]) if stragglers else None

    def _node_power_microwatts(self) -> int:
        """The node's ACPI power meter: its boards, plus a host (CPUs, NICs, fans, drives) that draws more
        under a job; the same instant as its boards' own readings."""
        boards = sum(self.workload.telemetry(board, self.state.t).power_watts for board in self.boards)
        host = NODE_HOST_WATTS + NODE_HOST_BUSY_WATTS * (self.workload.levels().power if self.workload.job else 0.0)
        return int(1e6 * (boards + host))

    def _core_temperature(self, offset: int) -> int:
        return int(1000 * (42 + (9 if self.workload.job else 0) + 2 * wave(self.state.t, offset)))

    def _build_sysfs(self) -> None:
        tree = self.tree
        for port in self.ib_ports:
            self._build_infiniband(port)
        for interface, megabits in ETHERNET.items():
            self._build_ethernet(interface, megabits)
        for chip in range(2):
            base = f"class/hwmon/hwmon{chip}"
            tree.set(f"{base}/name", "coretemp")
            tree.link(f"{base}/device", f"../../../coretemp.{chip}")
            for sensor in range(1, 17):
                tree.set(f"{base}/temp{sensor}_input", _text(self._core_temperature, chip + sensor))
                tree.set(f"{base}/temp{sensor}_label", f"Core {sensor - 1}")
                tree.set(f"{base}/temp{sensor}_max", "84000")
                tree.set(f"{base}/temp{sensor}_crit", "100000")
        meter = "class/hwmon/hwmon2"
        tree.set(f"{meter}/name", "power_meter")
        tree.link(f"{meter}/device", "../../../ACPI000D:00")
        tree.set(f"{meter}/power1_average", _text(self._node_power_microwatts))
        tree.set(f"{meter}/power1_average_interval", "1000")
        tree.set(f"{meter}/power1_cap", str(int(1e6 * NODE_POWER_CAP_WATTS)))
        tree.set("class/thermal/thermal_zone0/type", "x86_pkg_temp")
        tree.set("class/thermal/thermal_zone0/policy", "step_wise")
        tree.set("class/thermal/thermal_zone0/temp", lambda: str(1000 * (44 + (9 if self.workload.job else 0))))
        for board in self.boards:
            address = board.pci_bus_id.removeprefix("0000")
            tree.set(f"bus/pci/devices/{address.lower()}/vendor", "0x10de")
            tree.set(f"bus/pci/devices/{address.lower()}/class", "0x030200")
            tree.link(f"bus/pci/devices/{address.lower()}/driver", "../../../bus/pci/drivers/nvidia")
            self._build_aer(f"bus/pci/devices/{address.lower()}", board.index)
        for switch in range(4):
            tree.set(f"bus/pci/devices/0000:{5 + switch:02x}:00.0/vendor", "0x10de")
            tree.set(f"bus/pci/devices/0000:{5 + switch:02x}:00.0/class", "0x068000")
            self._build_aer(f"bus/pci/devices/0000:{5 + switch:02x}:00.0", None)

    def _build_aer(self, base: str, gpu: int | None) -> None:
        """A device's AER statistics files: a GPU's count its pcie_aer faults' errors since the node last booted,
        an NVSwitch's (`gpu` None) none."""
        for kind, (file, total) in AER_TYPES.items():
            self.tree.set(f"{base}/{file}", _text(self._aer_statistics, gpu, kind, total))

    def _aer_statistics(self, gpu: int | None, kind: str, total: str) -> str:
        counts = dict.fromkeys(_AER_NAMES["correctable" if kind == "correctable" else "uncorrectable"], 0)
        if gpu is not None and kind in _AER_FAULT_ERRORS:
            booted = self.state.booted()
            for fault in self.state.active(Kind.PCIE_AER, gpu):
                if kind == "nonfatal":
                    errors = 1 if booted <= fault.start <= self.state.t else 0
                else:
                    errors = int(fault.size * overlap(max(fault.start, booted), fault.end, self.state.t))
                counts[_AER_FAULT_ERRORS[kind]] += errors
        return "\n".join([*(f"{name} {count}" for name, count in counts.items()), f"{total} {sum(counts.values())}"])

    def net_dev(self) -> str:
        """/proc/net/dev: each interface's statistics as the kernel lists them, which node_exporter reads."""
        lines = ["Inter-|   Receive                                                |  Transmit",
                 " face |bytes    packets errs drop fifo frame compressed multicast|"
                 "bytes    packets errs drop fifo colls carrier compressed"]
        for interface in ETHERNET:
            statistics = f"class/net/{interface}/statistics"
            read = [self.tree.read(f"{statistics}/{direction}_{name}").decode().strip()
                    for direction in ("rx", "tx") for name in ("bytes", "packets", "errors", "dropped")]
            receive, transmit = read[:4], read[4:]
            lines.append(f"{interface:>6}: {' '.join(receive)} 0 0 0 0 {' '.join(transmit)} 0 0 0 0")
        return "\n".join(lines)

    def unplug(self, board: SimulatedGpu) -> None:
        """A board taken out: gone from the PCI bus."""
        self.tree.remove(f"bus/pci/devices/{board.pci_bus_id.removeprefix('0000').lower()}")

    def _build_infiniband(self, port: str) -> None:
        tree = self.tree
        device, number = port.split("/")
        base = f"class/infiniband/{device}"
        hca = _STORAGE_HCA if port == STORAGE_PORT else _TRAINING_HCA
        for name, value in (*hca, ("node_guid", f"946d:ae03:00{self.state.index % 256:02x}:{int(device[5:]):04x}")):
            tree.set(f"{base}/{name}", value)
        ports = f"{base}/ports/{number}"
        tree.set(f"{ports}/rate", _text(self._ib_rate, port))
        tree.set(f"{ports}/link_layer", "InfiniBand")
        tree.set(f"{ports}/state", lambda: "1: DOWN" if self.ib_down(port) else "4: ACTIVE")
        tree.set(f"{ports}/phys_state", lambda: "2: Polling" if self.ib_down(port) else "5: LinkUp")
        # 64 bits wide, as a current kernel fills them from the HCA's extended counters.
        for direction, name in (("tx", "xmit"), ("rx", "rcv")):
            tree.set(f"{ports}/counters/port_{name}_data", _text(self.ib_units, port, direction, 4))
            tree.set(f"{ports}/counters/port_{name}_packets", _text(self.ib_units, port, direction, 4096))
        tree.set(f"{ports}/counters/port_xmit_wait", _text(self._ib_xmit_wait, port))
        # The error counters are as narrow as the IBA's PortCounters, and stop at their maximum as an HCA's do.
        tree.set(f"{ports}/counters/symbol_error",
                 _text(_narrow, "symbol_error", self.state.counted, Kind.SYMBOL_ERRORS, None, port))
        tree.set(f"{ports}/counters/link_downed", _text(_narrow, "link_downed", self.ib_link_downed, port))
        for name in ("link_error_recovery", "port_rcv_errors", "port_xmit_discards",
                     "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors", "VL15_dropped"):
            tree.set(f"{ports}/counters/{name}", "0")
        for name in ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err"):
            tree.set(f"{ports}/hw_counters/{name}", "0")

    def ib_units(self, port: str, direction: str, size: int) -> int:
        """Bytes through a port counted in units of `size` (4-byte words, 4 KiB packets)."""
        return self.ib_bytes(port, direction) // size

    def _build_ethernet(self, interface: str, megabits: int) -> None:
        base = f"class/net/{interface}"
        link_bytes = megabits * 125_000
        # Management traffic is steady; the storage network reads training data at 4% of its link.
        share = 0.001 if interface == "eth0" else 0.04

        def bytes_moved(direction: str) -> int:
            total = share * link_bytes * self.state.t
            for fault in self.state.active(Kind.NIC_SATURATION, port=interface):
                if fault.direction == direction:
                    total += (fault.size - share) * link_bytes * overlap(fault.start, fault.end, self.state.t)
            return int(total)

        self.tree.set(f"{base}/statistics/rx_bytes", lambda: str(bytes_moved("rx")))
        self.tree.set(f"{base}/statistics/tx_bytes", lambda: str(bytes_moved("tx")))
        self.tree.set(f"{base}/statistics/rx_packets", lambda: str(bytes_moved("rx") // 9000))
        self.tree.set(f"{base}/statistics/tx_packets", lambda: str(bytes_moved("tx") // 9000))
        for name in ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped"):
            self.tree.set(f"{base}/statistics/{name}", "0")
        self.tree.set(f"{base}/speed", str(megabits))
        self.tree.set(f"{base}/operstate", "up")
        self.tree.set(f"{base}/carrier_changes", "1")
        self.tree.set(f"{base}/mtu", "9000")
        self.tree.set(f"{base}/address", f"b4:96:91:{self.state.index >> 8 & 0xff:02x}:{self.state.index & 0xff:02x}:"
                                          f"{list(ETHERNET).index(interface):02x}")
        self.tree.set(f"{base}/duplex", "full")
