"""One node's exporter, built one way: the hardware it reads and the collectors that read it.

`gpufleet exporter` builds its node from flags over this machine's hardware (or
simulated GPUs with `--gpu.backend=sim`); the fleet simulator builds each of its
nodes from the same flags' defaults over simulated hardware. A collector added
to `COLLECTORS` therefore reaches the exporter, the simulator and every
end-to-end test built on the simulator at once, with the same wiring.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pynvml

from gpufleet.exporter.collector import Collector, CollectorError
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.collector.hwmon import HwmonCollector
from gpufleet.exporter.collector.infiniband import InfinibandCollector
from gpufleet.exporter.collector.kernel import KernelCollector
from gpufleet.exporter.collector.network import NetworkCollector
from gpufleet.exporter.collector.pcie import PcieCollector
from gpufleet.exporter.collector.thermal_zone import ThermalZoneCollector
from gpufleet.exporter.gpu.nvml import Nvml
from gpufleet.exporter.gpu.session import GpuUnavailable, NvmlSession
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.kernellog import DevKmsg
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.state import FileStore, PersistentState
from gpufleet.exporter.tree import DiskTree
from gpufleet.flags import duration, positive_int

COLLECTORS: tuple[type[Collector], ...] = (
    GpuCollector,
    NetworkCollector,
    InfinibandCollector,
    HwmonCollector,
    PcieCollector,
    ThermalZoneCollector,
    KernelCollector,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose the hardware and configure each collector."""
    parser.add_argument("--path.sysfs", dest="sysfs_root", default="/sys", metavar="PATH",
                        help="sysfs mount point (default: %(default)s)")
    parser.add_argument("--path.procfs", dest="procfs_root", default="/proc", metavar="PATH",
                        help="procfs mount point, where job attribution reads <pid>/cgroup (default: %(default)s)")
    parser.add_argument("--path.kmsg", dest="kmsg_path", default="/dev/kmsg", metavar="PATH",
                        help="the kernel log, which the kernel collector (and --collector.gpu.xid-kmsg) follow "
                             "(default: %(default)s)")
    parser.add_argument(
        "--gpu.backend", dest="gpu_backend", choices=("auto", "nvml", "sim"), default="auto",
        help="auto: NVML where a driver is present, else report the GPU collector as failing; "
             "nvml: require NVML at start; sim: simulated GPUs (default: %(default)s)",
    )
    parser.add_argument("--path.state", dest="state_path", default="", metavar="DIR",
                        help="directory where the exporter keeps what must outlive a restart: XID counts, the "
                             "recovery action each GPU is held at, the InfiniBand ports seen ACTIVE; created if "
                             "missing; empty: kept in memory only (default: empty)")
    parser.add_argument("--sim.gpus", dest="sim_gpus", type=positive_int, default=8, metavar="N",
                        help="number of simulated GPUs with --gpu.backend=sim (default: %(default)s)")
    parser.add_argument("--sim.seed", dest="sim_seed", type=int, default=0, metavar="N",
                        help="seed of the simulated GPUs' identities and load (default: %(default)s)")
    for collector in COLLECTORS:
        name = collector.name
        group = parser.add_argument_group(f"collector {name}")
        group.add_argument(f"--collector.{name}", dest=f"collector_{name}", action=argparse.BooleanOptionalAction,
                           default=True, help=f"enable the {name} collector (default: enabled)")
        group.add_argument(f"--collector.{name}.interval", dest=f"collector_{name}_interval", type=duration,
                           default=collector.default_interval, metavar="DURATION",
                           help="time between collections, in seconds or as 500ms, 5s, 1m (default: %(default)ss)")
        group.add_argument(f"--collector.{name}.timeout", dest=f"collector_{name}_timeout", type=duration,
                           metavar="DURATION", help="abandon a collection after this long (default: the interval)")
        collector.add_arguments(group)


def defaults(*flags: str) -> argparse.Namespace:
    """Every flag of `add_arguments` at its default but `flags`: a node as `gpufleet exporter` runs it with them."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return parser.parse_args(list(flags))


def hardware(args: argparse.Namespace) -> Hardware:
    """This machine's hardware as the flags name it; raises CollectorError where it cannot be used.

    `auto` never falls back to simulated GPUs: a node whose driver is missing reports a failing GPU
    collector rather than invented data.
    """
    sysfs = DiskTree(args.sysfs_root)
    state = PersistentState(FileStore(args.state_path)) if args.state_path else PersistentState()
    if args.gpu_backend == "sim":
        # Imported here: a GPU node's exporter never loads the simulated library (psutil with it).
        from gpufleet.exporter.gpu.simulated.host import simulated_gpus, simulated_procfs
        from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml

        gpus = simulated_gpus(args.sim_gpus, args.sim_seed)
        # Simulated processes get simulated cgroup files, so attribution runs its production path.
        return Hardware(SimulatedNvml(gpus), sysfs, simulated_procfs(gpus), state=state,
                        kernel_log=DevKmsg(args.kmsg_path))
    library: Nvml = pynvml
    if args.gpu_backend == "nvml":
        session = NvmlSession(library)
        try:
            session.sample()
        except GpuUnavailable as err:
            raise CollectorError(f"--gpu.backend=nvml needs a working NVML: {err}") from None
        finally:
            session.close()
    return Hardware(library, sysfs, DiskTree(args.procfs_root), state=state, kernel_log=DevKmsg(args.kmsg_path))


def build(args: argparse.Namespace, node: Hardware) -> list[ScheduledCollector]:
    """The enabled collectors with their intervals, built but not started; raises CollectorError on a bad
    combination of flags.

    Every flag is checked before any collector is built, and a collector that refuses to be built closes
    those built before it, so a rejected start-up leaves nothing behind.
    """
    enabled = []
    for collector in COLLECTORS:
        name = collector.name
        if not getattr(args, f"collector_{name}"):
            continue
        interval = getattr(args, f"collector_{name}_interval")
        timeout = getattr(args, f"collector_{name}_timeout") or interval
        if timeout > interval:
            raise CollectorError(
                f"--collector.{name}.timeout ({timeout:g}s) must not exceed --collector.{name}.interval ({interval:g}s)"
            )
        enabled.append((collector, interval, timeout))
    scheduled: list[ScheduledCollector] = []
    try:
        for collector, interval, timeout in enabled:
            scheduled.append(ScheduledCollector(collector.from_args(args, node), interval, timeout))
    except CollectorError:
        close(scheduled)
        raise
    return scheduled


def close(collectors: Sequence[ScheduledCollector]) -> None:
    """Ask every collector to stop before waiting for any, so their background threads end together."""
    for collector in collectors:
        collector.stop()
    for collector in collectors:
        collector.close()
