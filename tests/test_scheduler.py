"""The scheduler and /metrics together, in process, with a real aiohttp server on 127.0.0.1."""

import asyncio
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector import Collection
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.collector.network import NetworkCollector
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.server import build_app
from gpufleet.exporter.state import FileStore, PersistentState
from gpufleet.exporter.tree import DiskTree

from helpers import eventually, named, parse, series


class HangingNvml(SimulatedNvml):
    """Simulated NVML whose power reading blocks, like a driver stuck in an ioctl, until released."""

    def __init__(self) -> None:
        super().__init__(simulated_gpus(2))
        self.hanging = False
        self.release = threading.Event()
        self.entered = threading.Event()
        self.inside = False  # True while a call is held: what each scrape below proves it did not wait for.

    def nvmlDeviceGetPowerUsage(self, gpu):
        if self.hanging:
            self.inside = True
            self.entered.set()
            self.release.wait(timeout=30)
            self.inside = False
        return super().nvmlDeviceGetPowerUsage(gpu)


@pytest.fixture
async def running():
    nvml = HangingNvml()
    gpu = ScheduledCollector(GpuCollector(NvmlSession(nvml)), interval=0.3, timeout=0.2)
    network = ScheduledCollector(NetworkCollector(DiskTree(FIXTURE_SYSFS)), interval=0.3, timeout=0.3)
    collectors = [gpu, network]
    client = TestClient(TestServer(build_app(Exposition(collectors)), host="127.0.0.1"))
    await client.start_server()
    tasks = [asyncio.create_task(c.run()) for c in collectors]
    try:
        yield nvml, client
    finally:
        nvml.release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


async def scrape(client):
    response = await client.get("/metrics")
    assert response.status == 200
    return parse(await response.read())


def success(samples, collector):
    return samples.get(series("gpufleet_collector_success", collector=collector))


async def test_a_hung_nvml_call_never_delays_a_scrape_and_fails_only_its_collector(running):
    nvml, client = running

    async def gpu_ok():
        samples = await scrape(client)
        return samples if success(samples, "gpu") == 1 else None

    samples = await eventually(gpu_ok)
    assert samples[series("gpufleet_gpu_devices")] == 2

    nvml.hanging = True
    assert await asyncio.to_thread(nvml.entered.wait, 5)
    answered_while_hung = []

    async def gpu_failed():
        samples = await scrape(client)
        answered_while_hung.append(nvml.inside)
        return samples if success(samples, "gpu") == 0 else None

    samples = await eventually(gpu_failed)
    # No stale GPU values while failing: only what the exporter keeps itself (each GPU's recovery action, none
    # here), and that the driver did not answer. The network collector carries on.
    assert {name for name, _ in samples if name.startswith("gpufleet_gpu_")} == {
        "gpufleet_gpu_recovery_action", "gpufleet_gpu_recovery_action_deferred", "gpufleet_gpu_xid_events_registered",
        "gpufleet_gpu_driver_up"}
    assert samples[series("gpufleet_gpu_driver_up")] == 0
    assert set(named(samples, "gpufleet_gpu_recovery_action").values()) == {0}
    assert success(samples, "network") == 1
    assert samples[series("gpufleet_network_up", device="eno1")] == 1

    # While the call stays hung, ticks are skipped and counted rather than piling up threads.
    threads_before = threading.active_count()

    async def skipped_twice():
        samples = await scrape(client)
        answered_while_hung.append(nvml.inside)
        return samples.get(series("gpufleet_collector_skipped_total", collector="gpu"), 0) >= 2

    await eventually(skipped_twice)
    assert threading.active_count() <= threads_before + 1  # At most the network collector's own worker.
    # Every one of those scrapes was answered while the NVML call was still held: none waited for it.
    assert answered_while_hung and all(answered_while_hung), answered_while_hung

    nvml.hanging = False
    nvml.release.set()
    samples = await eventually(gpu_ok)
    assert samples[series("gpufleet_gpu_devices")] == 2
    assert len(named(samples, "gpufleet_gpu_power_watts")) == 2


async def test_a_collector_that_raises_is_reported_and_the_exporter_keeps_serving():
    class Broken:
        name = "broken"
        default_interval = 1.0

        def collect(self):
            raise RuntimeError("unexpected failure inside the collector")

        def held(self, hung):
            return Collection(())

        def close(self):
            return None

    broken = ScheduledCollector(Broken(), interval=0.2, timeout=0.2)
    await broken.tick()
    assert broken.state.success is False
    body = parse(Exposition([broken]).body())
    assert body[series("gpufleet_collector_success", collector="broken")] == 0
    assert series("gpufleet_collector_last_success_timestamp_seconds", collector="broken") not in body
    assert body[series("gpufleet_collector_skipped_total", collector="broken")] == 0


async def test_cancelling_a_tick_as_its_collection_completes_stops_the_collector():
    """Python 3.11's wait_for loses a cancellation that arrives as the awaited future completes."""

    class Gated:
        name = "gated"
        default_interval = 1.0

        def __init__(self) -> None:
            self.entered = threading.Event()
            self.go = threading.Event()

        def collect(self):
            self.entered.set()
            self.go.wait(5)
            return Collection(())

        def held(self, hung):
            return Collection(())

        def close(self):
            return None

    gated = Gated()
    scheduled = ScheduledCollector(gated, interval=10, timeout=10)
    task = asyncio.create_task(scheduled.run())
    assert await asyncio.to_thread(gated.entered.wait, 5)
    [worker] = [t for t in threading.enumerate() if t.name == "collector-gated"]
    gated.go.set()
    # Block the loop until the worker has ended: its result is then queued for the loop, and the cancel
    # below arrives together with it, which is the race this test is about.
    worker.join(5)
    assert not worker.is_alive()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done == {task} and task.cancelled()


async def test_a_restarted_exporter_serves_what_it_kept_before_its_first_collection_ends(tmp_path):
    """The server listens before the first collection, which here hangs in NVML as a driver stuck at start-up: the
    scrapes meanwhile, and after it times out, find GPU 0 still held at the reset the last process kept."""
    first = HangingNvml()
    state = PersistentState(FileStore(tmp_path))
    collector = GpuCollector(NvmlSession(first), state=state)
    collector.collect()
    collector.xids.record_nvml(0, first.gpus[0].uuid, first.gpus[0].pci_bus_id, 62)
    collector.collect()  # Held at a reset, and kept in the state file.
    restarted = HangingNvml()
    restarted.hanging = True
    gpu = ScheduledCollector(GpuCollector(NvmlSession(restarted), state=PersistentState(FileStore(tmp_path))),
                             interval=0.3, timeout=0.2)
    client = TestClient(TestServer(build_app(Exposition([gpu])), host="127.0.0.1"))
    await client.start_server()
    task = asyncio.create_task(gpu.run())
    try:
        assert await asyncio.to_thread(restarted.entered.wait, 5)
        early = await scrape(client)  # The first collection has not returned.
        held = series("gpufleet_gpu_recovery_action", gpu="0", uuid=first.gpus[0].uuid)
        assert early[held] == 2 and success(early, "gpu") == 0
        # A tick skipped shows that the collection timed out and the next found it still running.
        timed_out = await eventually(lambda: _skipped(client))
        assert timed_out[held] == 2 and timed_out[series("gpufleet_gpu_driver_up")] == 0
    finally:
        restarted.release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


async def _skipped(client):
    samples = await scrape(client)
    return samples if samples.get(series("gpufleet_collector_skipped_total", collector="gpu"), 0) > 0 else None
