"""GPU metrics through NVML, one series per GPU labelled by index and UUID.

The collector only turns an `NvmlSession` sample into metric families; what is
read, and how NVML errors are handled, lives in `exporter.gpu`. Which NVML
library sits behind the session is chosen by `--gpu.backend`: `auto` and
`nvml` use the real driver, `sim` a simulated one. `auto` never falls back to
simulated GPUs, so a node whose driver is missing reports a failing GPU
collector rather than invented data.
"""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

import pynvml

from exporter.collector import Collection, CollectorError, FamilySet
from exporter.flags import positive_int
from exporter.gpu.session import GpuUnavailable, NodeSample, NvmlSession
from exporter.gpu.simulated import SimulatedNvml, simulated_gpus

_GPU_LABELS = ("gpu", "uuid")
_INFO_LABELS = ("gpu", "uuid", "name", "pci_bus_id", "serial", "vbios", "driver_version", "cuda_version")


def families_for(sample: NodeSample) -> Collection:
    """The metric families of one NVML sample."""
    families = FamilySet()
    families.gauge("gpufleet_gpu_devices", "GPUs that NVML enumerates.", ()).add_metric([], sample.device_count)
    for gpu in sample.gpus:
        identity = gpu.identity
        base = [str(identity.index), identity.uuid]
        families.gauge("gpufleet_gpu_info", "GPU metadata; the value is always 1.", _INFO_LABELS).add_metric(
            base + [identity.name, identity.pci_bus_id, identity.serial, identity.vbios,
                    sample.driver_version, sample.cuda_version],
            1.0,
        )
        for reading in gpu.readings:
            metric = reading.metric
            make = families.counter if metric.counter else families.gauge
            make(metric.name, metric.documentation, _GPU_LABELS + metric.labels).add_metric(
                base + list(reading.label_values), reading.value
            )
    return families.collection(sample.problems)


class GpuCollector:
    name: ClassVar[str] = "gpu"
    default_interval: ClassVar[float] = 5.0

    def __init__(self, session: NvmlSession) -> None:
        self.session = session

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--gpu.backend", dest="gpu_backend", choices=("auto", "nvml", "sim"), default="auto",
            help="auto: NVML where a driver is present, else report the GPU collector as failing; "
                 "nvml: require NVML at start; sim: simulated GPUs (default: %(default)s)",
        )
        parser.add_argument("--sim.gpus", dest="sim_gpus", type=positive_int, default=8, metavar="N",
                            help="number of simulated GPUs with --gpu.backend=sim (default: %(default)s)")
        parser.add_argument("--sim.seed", dest="sim_seed", type=int, default=0, metavar="N",
                            help="seed of the simulated GPUs' identities and load (default: %(default)s)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GpuCollector:
        library: Any = pynvml
        if args.gpu_backend == "sim":
            library = SimulatedNvml(simulated_gpus(args.sim_gpus, args.sim_seed))
        session = NvmlSession(library)
        if args.gpu_backend == "nvml":
            try:
                session.sample()
            except GpuUnavailable as err:
                raise CollectorError(f"--gpu.backend=nvml needs a working NVML: {err}") from None
        return cls(session)

    def collect(self) -> Collection:
        return families_for(self.session.sample())

    def close(self) -> None:
        self.session.close()
