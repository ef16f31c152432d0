"""Faults injected while the exporter runs and is scraped: the affected collector fails and recovers, nothing else.

The GPU faults go through the simulated NVML library, the NIC faults through a private copy of the
fixture sysfs. A hung NVML call, one lost GPU, and all GPUs lost and back after a driver reload are
in test_scheduler.py and test_gpu_health.py.
"""

import asyncio
import shutil

import pynvml
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.collector.infiniband import InfinibandCollector
from gpufleet.exporter.collector.network import NetworkCollector
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.server import build_app
from gpufleet.exporter.tree import DiskTree

from helpers import eventually, named, parse, series


class SurprisingNvml(SimulatedNvml):
    """Simulated NVML that can raise what no NVML binding should: a plain RuntimeError."""

    surprise = False

    def nvmlDeviceGetPowerUsage(self, handle):
        if self.surprise:
            raise RuntimeError("ctypes returned something odd")
        return super().nvmlDeviceGetPowerUsage(handle)


@pytest.fixture
async def running(sysfs):
    nvml = SurprisingNvml(simulated_gpus(2))
    collectors = [
        ScheduledCollector(GpuCollector(NvmlSession(nvml, backoff_initial=0.05, backoff_max=0.1)), 0.2, 0.2),
        ScheduledCollector(NetworkCollector(DiskTree(sysfs)), 0.2, 0.2),
        ScheduledCollector(InfinibandCollector(DiskTree(sysfs)), 0.2, 0.2),
    ]
    client = TestClient(TestServer(build_app(Exposition(collectors)), host="127.0.0.1"))
    await client.start_server()
    tasks = [asyncio.create_task(c.run()) for c in collectors]

    async def success():
        response = await client.get("/metrics")
        assert response.status == 200  # The exporter keeps serving, whatever fails.
        samples = parse(await response.read())
        return samples, {dict(l)["collector"]: v for l, v in named(samples, "gpufleet_collector_success").items()}

    try:
        await eventually(lambda: _all_ok(success))
        yield nvml, sysfs, success
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for collector in collectors:
            collector.close()
        await client.close()


async def _all_ok(success):
    _, states = await success()
    return states == {"gpu": 1, "network": 1, "infiniband": 1}


def _inject(kind, nvml, sysfs):
    """Apply one fault; returns the collector it should fail and how to undo it."""
    if kind == "nvml_driver_gone":
        nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
        nvml.reload_driver()
        return "gpu", lambda: setattr(nvml, "init_error", None)
    if kind == "nvml_library_missing":
        nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
        nvml.reload_driver()
        return "gpu", lambda: setattr(nvml, "init_error", None)
    if kind == "unexpected_exception":
        nvml.surprise = True
        return "gpu", lambda: setattr(nvml, "surprise", False)
    if kind == "unreadable_file":
        target = sysfs / "class/net/eno1/statistics/rx_bytes"
        target.unlink()
        target.mkdir()

        def undo():
            target.rmdir()
            target.write_text("9876543210123\n")

        return "network", undo
    if kind == "garbage_counter":
        target = sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
        target.write_text("ERROR\n")
        return "infiniband", lambda: target.write_text("7\n")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["nvml_driver_gone", "nvml_library_missing", "unexpected_exception",
                                  "unreadable_file", "garbage_counter"])
async def test_the_affected_collector_fails_and_recovers_and_nothing_else_changes(running, kind):
    nvml, sysfs, success = running
    affected, undo = _inject(kind, nvml, sysfs)

    async def failing():
        samples, states = await success()
        return (samples, states) if states[affected] == 0 else None

    samples, states = await eventually(failing)
    assert {name: value for name, value in states.items() if name != affected} == {
        name: 1 for name in states if name != affected}
    if affected != "gpu":
        assert samples[series("gpufleet_gpu_devices")] == 2
    if affected != "network":
        assert samples[series("gpufleet_network_up", device="eno1")] == 1
    undo()
    await eventually(lambda: _all_ok(success))


async def test_a_hot_unplugged_nic_disappears_and_comes_back_without_failing(running):
    """A NIC that leaves is the hardware's state, not a broken collection: node_exporter agrees."""
    _, sysfs, success = running
    saved = sysfs.parent / "eno2-saved"
    shutil.move(sysfs / "class/net/eno2", saved)

    async def gone():
        samples, _states = await success()
        return samples if series("gpufleet_network_up", device="eno2") not in samples else None

    await eventually(gone)
    assert (await success())[1]["network"] == 1
    shutil.move(saved, sysfs / "class/net/eno2")

    async def back():
        samples, _ = await success()
        return series("gpufleet_network_up", device="eno2") in samples

    await eventually(back)
