"""The golden exposition: what a node serves on /metrics, committed and diffed, as node_exporter's e2e-output.txt.

The node is built by the exporter's own code over the fixture sysfs tree and simulated GPUs whose
readings do not change with time, with one XID raised. Every change of a metric name, label, HELP
text or value then shows up as a diff of tests/fixtures/e2e-output.txt in review. After a change
that is meant, rewrite the file with

    .venv/bin/python -m pytest tests/test_golden.py --update-golden

and commit it with the change. Values that differ between runs (durations, timestamps, the Python
version, the process's own metrics) are masked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufleet.exporter import node
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.simulated import (
    GpuTelemetry,
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    kubernetes_cgroup,
    simulated_procfs,
    slurm_cgroup,
    steady,
)
from gpufleet.exporter.tree import DiskTree

from helpers import FIXTURE_SYSFS, FakeClock
from programs import wait_for

GOLDEN = Path(__file__).parent / "fixtures" / "e2e-output.txt"
GIB = 1024**3
# Series whose values differ between any two runs, and what they are shown as.
_VOLATILE = re.compile(r"^(gpufleet_collector_duration_seconds|gpufleet_collector_last_success_timestamp_seconds"
                       r"|gpufleet_gpu_xid_last_timestamp_seconds)(\{.*\})? .*$")


def boards() -> list[SimulatedGpu]:
    """A busy SXM board of a Slurm job and an idle PCIe board with fans, held by a Kubernetes pod."""
    busy = SimulatedGpu(
        index=0, uuid="GPU-00000000-1111-2222-3333-444444444444", serial="1650923000001",
        pci_bus_id="00000000:18:00.0",
        load=steady(GpuTelemetry(utilization=0.87, memory_copy_utilization=0.41, memory_used_bytes=40 * GIB,
                                 power_watts=612.5, energy_joules=123456.789, temperature_celsius=64,
                                 memory_temperature_celsius=71, sm_clock_hertz=1755e6)),
        ecc_errors={("corrected", "volatile"): 3, ("corrected", "aggregate"): 12},
        nvlinks=2, processes=[SimulatedProcess(4101, slurm_cgroup(4242, 0))])
    idle = SimulatedGpu(
        index=1, uuid="GPU-55555555-6666-7777-8888-999999999999", serial="1650923000002",
        pci_bus_id="00000000:2A:00.0", name="NVIDIA A100-PCIE-40GB", memory_total_bytes=40 * GIB,
        power_limit_watts=250.0, unsupported=set(), nvlinks=0,
        load=steady(GpuTelemetry(memory_used_bytes=2**29, power_watts=71.25, energy_joules=9000.0,
                                 temperature_celsius=31, memory_temperature_celsius=36,
                                 fan_speed_ratios=(0.3, 0.35), pcie_generation=4, pcie_width=8)),
        processes=[SimulatedProcess(4102, kubernetes_cgroup("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "c" * 64))])
    return [busy, idle]


def masked(body: str) -> str:
    lines = []
    for line in body.splitlines():
        if re.match(r"^(# (HELP|TYPE) )?process_", line):
            continue  # prometheus_client's own process metrics: they exist on Linux only, with values of the run.
        line = _VOLATILE.sub(r"\1\2 <varies>", line)
        lines.append(re.sub(r'python_version="[^"]*"', 'python_version="<python>"', line))
    return "\n".join(lines) + "\n"


def golden_exposition() -> str:
    gpus = boards()
    nvml = SimulatedNvml(gpus, clock=FakeClock(1000.0))
    hardware = node.Hardware(nvml, DiskTree(FIXTURE_SYSFS), simulated_procfs(gpus), nvml_event_wait_ms=50)
    collectors = node.build(node.defaults(), hardware)
    [gpu] = [c for c in collectors if c.name == "gpu"]
    try:
        for collector in collectors:
            collector.start()
        ledger = gpu.collector.xids
        wait_for(lambda: ledger.watching, 10, "the XID watcher's registration")
        nvml.inject_xid(0, 31)
        wait_for(ledger.snapshot, 10, "the XID in the ledger")
        for collector in collectors:
            collector.collect_now()
        return masked(Exposition(collectors).body().decode())
    finally:
        node.close(collectors)


def test_the_exposition_is_the_committed_one(request: pytest.FixtureRequest) -> None:
    served = golden_exposition()
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(served)
    assert served == GOLDEN.read_text(), (
        "/metrics changed; if that is meant, run `.venv/bin/python -m pytest tests/test_golden.py "
        "--update-golden` and commit tests/fixtures/e2e-output.txt with the change")
