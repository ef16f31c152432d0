"""The golden exposition: what a node serves on /metrics, committed and diffed, as node_exporter's e2e-output.txt.

The node is built by the exporter's own code over the fixture sysfs tree and simulated GPUs whose
readings do not change with time, with one XID raised, and its GPUs are collected twice, 15 s apart, so
that the GPM series, which span two collections, are there (with `--collector.gpu.gpm-detail`, so that
the opt-in ones are too). Every change of a metric name, label, HELP
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

from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter import node
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.simulated.board import SimulatedGpu, SimulatedProcess
from gpufleet.exporter.gpu.simulated.host import kubernetes_cgroup, mig_devices, simulated_procfs, slurm_cgroup
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.hardware import Hardware
from gpufleet.exporter.tree import DiskTree

from helpers import FIXTURE_SYSFS, FakeClock, two_boards

GOLDEN = Path(__file__).parent / "fixtures" / "e2e-output.txt"
GIB = 1024**3
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
    lines = []
    for line in body.splitlines():
        if re.match(r"^(# (HELP|TYPE) )?process_", line):
            continue  # prometheus_client's own process metrics: they exist on Linux only, with values of the run.
        line = _VOLATILE.sub(r"\1\2 <varies>", line)
        lines.append(re.sub(r'python_version="[^"]*"', 'python_version="<python>"', line))
    return "\n".join(lines) + "\n"


def golden_exposition() -> str:
    gpus = boards()
    clock = FakeClock(1000.0)
    nvml = SimulatedNvml(gpus, clock=clock)
    hardware = Hardware(nvml, DiskTree(FIXTURE_SYSFS), simulated_procfs(gpus), nvml_event_wait_ms=50)
    flags = node.defaults()
    flags.gpu_gpm_detail = True  # So that every GPM series is in the file, the opt-in ones too.
    collectors = node.build(flags, hardware)
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
        clock.now += 15  # GPM reports the interval between two collections.
        gpu.collect_now()
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
