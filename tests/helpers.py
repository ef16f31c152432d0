"""Helpers shared by the tests: parsing exposition text into comparable samples, and two simulated boards."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools import paths
from gpufleet.exporter.collector import Collection
from gpufleet.exporter.gpu.simulated.board import GpuTelemetry, SimulatedGpu, steady
from gpufleet.exporter.render import render

FIXTURE_SYSFS = paths.FIXTURE_SYSFS


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


def two_boards():
    """A busy H100 SXM board and an idle A100 PCIe board with fans, reading the same at any time."""
    return [
        SimulatedGpu(index=0, uuid=UUID0, load=steady(BUSY), serial="1650923000001", pci_bus_id="00000000:18:00.0"),
        SimulatedGpu(index=1, uuid=UUID1, load=steady(IDLE), serial="1650923000002", pci_bus_id="00000000:2A:00.0",
                     name="NVIDIA A100-PCIE-40GB", memory_total_bytes=40 * GIB, power_limit_watts=250.0,
                     unsupported=set(), gpm_supported=False),
    ]


Sample = tuple[str, frozenset[tuple[str, str]]]


def parse(text: str | bytes) -> dict[Sample, float]:
    """Every sample as {(name, labels): value}; fails on a duplicate series, which Prometheus would reject."""
    if isinstance(text, bytes):
        text = text.decode()
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


def rendered(collection: Collection) -> dict[Sample, float]:
    """A collection as /metrics would show it."""
    return parse(render(collection.families))


def series(metric: str, /, **labels: str) -> Sample:
    return (metric, frozenset(labels.items()))


def named(samples: dict[Sample, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The series of one metric name, keyed by their labels."""
    return {labels: value for (sample_name, labels), value in samples.items() if sample_name == name}


class FakeClock:
    """A clock the test moves by hand: `clock.now += 1`."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def nvml_present() -> bool:
    """Whether this machine has a working NVIDIA driver (tests that assume none skip there)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


async def eventually(check, timeout: float = 5.0, interval: float = 0.02):
    """Await `check()` until it returns a truthy value, at most `timeout` seconds; returns that value."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
