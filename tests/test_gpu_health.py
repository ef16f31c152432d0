"""GPU health signals injected through the simulated NVML while the exporter runs, asserted on /metrics.

Eight simulated H100s with steady loads sit behind the production session, XID
watcher and scheduler; the server is a real aiohttp server on 127.0.0.1.
"""

import asyncio

import pynvml
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpufleet.devtools.nodes import two_boards
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector import FamilySet
from gpufleet.exporter.collector.gpu import GpuCollector, add_pci_devices
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.gpu.nvlink import TRANSMIT, NvlinkSummary
from gpufleet.exporter.gpu.probes import NVLINK_TRANSMIT, Reading
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.board import GpuTelemetry, SimulatedGpu, steady
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.xid import NvmlXidWatcher, XidLedger
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.server import build_app
from gpufleet.exporter.sysfs import SysfsReader
from gpufleet.exporter.tree import DiskTree, MemoryTree

from helpers import eventually, named, parse, rendered, series

LOAD = GpuTelemetry(utilization=0.9, memory_used_bytes=2**34, power_watts=650.0, energy_joules=5000.0,
                    temperature_celsius=70, memory_temperature_celsius=75, sm_clock_hertz=1980e6)


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def gpu(index: int, name: str = "gpufleet_gpu_up", **labels: str):
    return series(name, gpu=str(index), uuid=uuid(index), **labels)


class Exporter:
    def __init__(self, nvml: SimulatedNvml, client: TestClient) -> None:
        self.nvml = nvml
        self.client = client

    async def scrape(self):
        response = await self.client.get("/metrics")
        assert response.status == 200
        return parse(await response.read())

    async def scrape_until(self, check, timeout: float = 5.0):
        """The first scrape for which `check(samples)` holds (collections run every 250 ms)."""
        async def attempt():
            samples = await self.scrape()
            return samples if check(samples) else None

        return await eventually(attempt, timeout=timeout, interval=0.1)


@pytest.fixture
async def exporter():
    gpus = [SimulatedGpu(index=i, uuid=uuid(i), load=steady(LOAD), pci_bus_id=f"00000000:{0x18 + i:02X}:00.0")
            for i in range(8)]
    nvml = SimulatedNvml(gpus)
    ledger = XidLedger()
    watcher = NvmlXidWatcher(nvml, ledger, wait_ms=20, backoff_initial=0.05, backoff_max=0.2)
    collector = GpuCollector(NvmlSession(nvml, backoff_initial=0.05, backoff_max=0.2), sysfs=DiskTree(FIXTURE_SYSFS),
                             xids=ledger, xid_sources=[watcher])
    scheduled = ScheduledCollector(collector, interval=0.25, timeout=0.25)
    client = TestClient(TestServer(build_app(Exposition([scheduled])), host="127.0.0.1"))
    await client.start_server()
    watcher.start()
    task = asyncio.create_task(scheduled.run())
    harness = Exporter(nvml, client)
    try:
        await harness.scrape_until(lambda s: s.get(series("gpufleet_gpu_xid_events_registered")) == 1
                                   and s.get(series("gpufleet_collector_success", collector="gpu")) == 1)
        yield harness
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(collector.close)
        await client.close()


async def test_a_healthy_node_reports_every_signal_with_healthy_values(exporter):
    samples = await exporter.scrape()
    assert samples[series("gpufleet_gpu_devices")] == 8
    assert samples[series("gpufleet_gpu_pci_devices")] == 8  # The NVSwitches, the BMC VGA and the NICs are not GPUs.
    assert set(named(samples, "gpufleet_gpu_up").values()) == {1}
    assert samples[gpu(0, "gpufleet_gpu_ecc_enabled")] == 1
    assert samples[gpu(0, "gpufleet_gpu_ecc_errors_total", error="uncorrected", scope="aggregate")] == 0
    assert samples[gpu(0, "gpufleet_gpu_row_remap_pending")] == 0
    assert samples[gpu(0, "gpufleet_gpu_remapped_rows", cause="correctable")] == 0
    assert samples[gpu(0, "gpufleet_gpu_pcie_replays_total")] == 0
    assert samples[gpu(0, "gpufleet_gpu_nvlink_links")] == samples[gpu(0, "gpufleet_gpu_nvlink_links_up")] == 18
    assert samples[gpu(0, "gpufleet_gpu_nvlink_errors_total", error="crc_data")] == 0
    assert samples[gpu(0, "gpufleet_gpu_nvlink_transmit_bytes_total")] == 18 * 5000 * 250 * 1024
    # Healthy links have no series of their own by default (see test_nvlink_series_per_link).
    assert not named(samples, "gpufleet_gpu_nvlink_up") and not named(samples, "gpufleet_gpu_nvlink_link_errors_total")
    assert samples[gpu(0, "gpufleet_gpu_clock_event_active", reason="sw_power_cap")] == 0
    assert samples[gpu(0, "gpufleet_gpu_violation_seconds_total", policy="thermal")] == 0
    # Hopper has no page retirement: left out, not zero.
    assert not named(samples, "gpufleet_gpu_retired_pages")
    assert not named(samples, "gpufleet_gpu_xid_errors_total")


async def test_every_xid_counts_including_the_second_identical_one(exporter):
    exporter.nvml.inject_xid(2, 13)
    exporter.nvml.inject_xid(2, 13)
    exporter.nvml.inject_xid(2, 31)
    samples = await exporter.scrape_until(
        lambda s: s.get(gpu(2, "gpufleet_gpu_xid_errors_total", xid="13")) == 2
        and s.get(gpu(2, "gpufleet_gpu_xid_errors_total", xid="31")) == 1)
    assert len(named(samples, "gpufleet_gpu_xid_errors_total")) == 2
    assert samples[gpu(2, "gpufleet_gpu_xid_last_timestamp_seconds", xid="13")] > 1.7e9


async def test_an_xid_followed_by_the_gpu_falling_off_the_bus(exporter):
    exporter.nvml.inject_xid(3, 79)
    exporter.nvml.gpus[3].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    samples = await exporter.scrape_until(lambda s: s.get(gpu(3)) == 0
                                          and s.get(gpu(3, "gpufleet_gpu_xid_errors_total", xid="79")) == 1)
    assert sorted(name for name, labels in samples if ("gpu", "3") in labels) == [
        "gpufleet_gpu_info", "gpufleet_gpu_recovery_action", "gpufleet_gpu_recovery_action_deferred",
        "gpufleet_gpu_recovery_action_reason", "gpufleet_gpu_up", "gpufleet_gpu_xid_errors_total",
        "gpufleet_gpu_xid_last_timestamp_seconds"]
    assert samples[gpu(3, "gpufleet_gpu_recovery_action")] == 3  # Its node must be rebooted.
    for other in (0, 1, 2, 4, 5, 6, 7):
        assert samples[gpu(other)] == 1
        assert samples[gpu(other, "gpufleet_gpu_power_watts")] == 650.0
    assert samples[series("gpufleet_collector_success", collector="gpu")] == 0


async def test_xid_counts_survive_a_driver_reload_and_events_are_registered_again(exporter):
    exporter.nvml.inject_xid(0, 48)
    await exporter.scrape_until(lambda s: s.get(gpu(0, "gpufleet_gpu_xid_errors_total", xid="48")) == 1)
    exporter.nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    exporter.nvml.reload_driver()
    samples = await exporter.scrape_until(lambda s: s.get(gpu(0)) == 0)
    assert set(named(samples, "gpufleet_gpu_up").values()) == {0}
    assert samples[gpu(0, "gpufleet_gpu_xid_errors_total", xid="48")] == 1
    assert not named(samples, "gpufleet_gpu_power_watts")

    exporter.nvml.init_error = None
    await exporter.scrape_until(lambda s: set(named(s, "gpufleet_gpu_up").values()) == {1}
                                and s.get(series("gpufleet_gpu_xid_events_registered")) == 1)
    exporter.nvml.inject_xid(0, 48)
    await exporter.scrape_until(lambda s: s.get(gpu(0, "gpufleet_gpu_xid_errors_total", xid="48")) == 2)


async def test_ecc_counts_and_a_disabled_ecc(exporter):
    board = exporter.nvml.gpus[1]
    board.ecc_errors.update({("corrected", "volatile"): 5, ("uncorrected", "volatile"): 1,
                             ("corrected", "aggregate"): 17, ("uncorrected", "aggregate"): 2})
    exporter.nvml.gpus[4].ecc_mode = 0
    exporter.nvml.gpus[4].ecc_errors[("corrected", "volatile")] = 3
    samples = await exporter.scrape_until(
        lambda s: s.get(gpu(1, "gpufleet_gpu_ecc_errors_total", error="corrected", scope="volatile")) == 5)
    errors = named(samples, "gpufleet_gpu_ecc_errors_total")
    assert {dict(l)["error"] + "/" + dict(l)["scope"]: v for l, v in errors.items() if ("gpu", "1") in l} == {
        "corrected/volatile": 5, "uncorrected/volatile": 1, "corrected/aggregate": 17, "uncorrected/aggregate": 2}
    assert samples[gpu(4, "gpufleet_gpu_ecc_enabled")] == 0
    assert not [l for l in named(samples, "gpufleet_gpu_ecc_errors_total") if ("gpu", "4") in l]


async def test_row_remap_pending_and_failure(exporter):
    board = exporter.nvml.gpus[5]
    board.remapped_rows.update(correctable=3, uncorrectable=1)
    board.row_remap_pending = True
    samples = await exporter.scrape_until(lambda s: s.get(gpu(5, "gpufleet_gpu_row_remap_pending")) == 1)
    assert samples[gpu(5, "gpufleet_gpu_remapped_rows", cause="correctable")] == 3
    assert samples[gpu(5, "gpufleet_gpu_remapped_rows", cause="uncorrectable")] == 1
    assert samples[gpu(5, "gpufleet_gpu_row_remap_failed")] == 0
    board.row_remap_failed = True
    samples = await exporter.scrape_until(lambda s: s.get(gpu(5, "gpufleet_gpu_row_remap_failed")) == 1)
    assert samples[gpu(4, "gpufleet_gpu_row_remap_failed")] == 0


async def test_nvlink_down_and_crc_errors(exporter):
    board = exporter.nvml.gpus[6]
    board.nvlinks_down.add(3)
    board.nvlink_errors.update({(5, "crc_flit"): 120, (5, "crc_data"): 7, (5, "replay"): 4, (5, "recovery"): 1})
    samples = await exporter.scrape_until(lambda s: s.get(gpu(6, "gpufleet_gpu_nvlink_up", link="3")) == 0)
    # Only the links at fault get series of their own, so the alerts can name them.
    assert named(samples, "gpufleet_gpu_nvlink_up") == {gpu(6, "gpufleet_gpu_nvlink_up", link="3")[1]: 0}
    assert samples[gpu(6, "gpufleet_gpu_nvlink_links_up")] == 17
    errors = {(dict(l)["gpu"], dict(l)["link"], dict(l)["error"]): v
              for l, v in named(samples, "gpufleet_gpu_nvlink_link_errors_total").items()}
    assert errors == {("6", "5", "crc_flit"): 120, ("6", "5", "crc_data"): 7, ("6", "5", "replay"): 4,
                      ("6", "5", "recovery"): 1}
    assert samples[gpu(6, "gpufleet_gpu_nvlink_errors_total", error="crc_flit")] == 120
    board.nvlinks_down.clear()
    samples = await exporter.scrape_until(lambda s: s.get(gpu(6, "gpufleet_gpu_nvlink_links_up")) == 18)
    assert not named(samples, "gpufleet_gpu_nvlink_up")  # Back up: the alert on it resolves.
    assert len(named(samples, "gpufleet_gpu_nvlink_link_errors_total")) == 4  # An erring link keeps its counters.


def test_nvlink_series_per_link():
    collection = GpuCollector(NvmlSession(SimulatedNvml(two_boards())), nvlink_per_link=True).collect()
    samples = rendered(collection)
    assert len([l for l in named(samples, "gpufleet_gpu_nvlink_up") if ("gpu", "0") in l]) == 18
    assert len([l for l in named(samples, "gpufleet_gpu_nvlink_link_errors_total") if ("gpu", "0") in l]) == 18 * 4
    per_link = sum(v for l, v in named(samples, "gpufleet_gpu_nvlink_link_transmit_bytes_total").items()
                   if ("gpu", "0") in l)
    [total] = [v for l, v in named(samples, "gpufleet_gpu_nvlink_transmit_bytes_total").items() if ("gpu", "0") in l]
    assert per_link == total > 0


def test_nvlink_totals_never_fall_when_a_link_read_fails():
    summary = NvlinkSummary()

    def links(*values):
        return [Reading(NVLINK_TRANSMIT, value, (str(link),)) for link, value in enumerate(values)]

    def total(readings):
        [value] = [r.value for r in readings if r.metric is TRANSMIT]
        return value

    assert total(summary.apply("GPU-a", links(10, 20))) == 30
    assert total(summary.apply("GPU-a", links(15)[:1])) == 35  # Link 1 not read: its last value stays in.
    assert total(summary.apply("GPU-a", links(16, 25))) == 41
    assert total(summary.apply("GPU-a", links(1, 2))) == 3  # The driver reset the counters: so does the total.


async def test_pcie_replays(exporter):
    exporter.nvml.gpus[7].pcie_replays = 4242
    await exporter.scrape_until(lambda s: s.get(gpu(7, "gpufleet_gpu_pcie_replays_total")) == 4242)


@pytest.mark.parametrize(("reason", "bit"), [
    ("applications_clocks_setting", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
    ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
    ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
    ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
    ("sw_thermal_slowdown", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
    ("hw_thermal_slowdown", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
    ("hw_power_brake_slowdown", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ("display_clock_setting", pynvml.nvmlClocksEventReasonDisplayClockSetting),
])
async def test_each_clock_event_reason_sets_exactly_its_own_gauge(exporter, reason, bit):
    exporter.nvml.gpus[2].clock_events = bit
    samples = await exporter.scrape_until(
        lambda s: s.get(gpu(2, "gpufleet_gpu_clock_event_active", reason=reason)) == 1)
    active = {dict(l)["reason"] for l, v in named(samples, "gpufleet_gpu_clock_event_active").items()
              if ("gpu", "2") in l and v == 1}
    assert active == {reason}
    assert not [l for l, v in named(samples, "gpufleet_gpu_clock_event_active").items() if ("gpu", "3") in l and v]


async def test_an_idle_gpu_reports_the_idle_reason_and_violation_time_accumulates(exporter):
    exporter.nvml.gpus[0].load = steady(GpuTelemetry(utilization=0.0))
    exporter.nvml.gpus[0].violation_seconds[pynvml.NVML_PERF_POLICY_POWER] = 12.5
    exporter.nvml.gpus[0].violation_seconds[pynvml.NVML_PERF_POLICY_THERMAL] = 0.25
    samples = await exporter.scrape_until(
        lambda s: s.get(gpu(0, "gpufleet_gpu_clock_event_active", reason="gpu_idle")) == 1)
    assert samples[gpu(0, "gpufleet_gpu_violation_seconds_total", policy="power")] == 12.5
    assert samples[gpu(0, "gpufleet_gpu_violation_seconds_total", policy="thermal")] == 0.25
    assert samples[gpu(1, "gpufleet_gpu_clock_event_active", reason="gpu_idle")] == 0


async def test_a_gpu_bound_to_vfio_pci_is_counted_apart_and_one_bound_to_no_driver_still_counts(exporter):
    """The fixture's ninth GPU is passed through to a VM (vfio-pci): NVML is not meant to list it. A GPU whose
    nvidia driver failed to bind (no `driver` link) is one NVML should list, and GpuMissingFromNvml is for it."""
    samples = await exporter.scrape()
    assert samples[series("gpufleet_gpu_pci_devices")] == 8
    assert samples[series("gpufleet_gpu_pci_devices_other_driver", driver="vfio-pci")] == 1
    tree = MemoryTree()
    for address, driver in (("0000:18:00.0", "nvidia"), ("0000:19:00.0", None), ("0000:1a:00.0", "vfio-pci"),
                            ("0000:1b:00.0", "nouveau")):
        tree.set(f"bus/pci/devices/{address}/vendor", "0x10de")
        tree.set(f"bus/pci/devices/{address}/class", "0x030200")
        if driver:
            tree.link(f"bus/pci/devices/{address}/driver", f"../../../bus/pci/drivers/{driver}")
    families = FamilySet()
    add_pci_devices(families, SysfsReader(tree))
    found = rendered(families.collection())
    assert found == {series("gpufleet_gpu_pci_devices"): 2,
                     series("gpufleet_gpu_pci_devices_other_driver", driver="nouveau"): 1,
                     series("gpufleet_gpu_pci_devices_other_driver", driver="vfio-pci"): 1}, found


async def test_a_gpu_nvml_no_longer_lists_is_still_seen_on_the_pci_bus(exporter):
    exporter.nvml.gpus.pop()  # After a driver reload, NVML enumerates only seven of the eight boards.
    exporter.nvml.reload_driver()
    samples = await exporter.scrape_until(lambda s: s.get(series("gpufleet_gpu_devices")) == 7)
    assert samples[series("gpufleet_gpu_pci_devices")] == 8
    assert samples[gpu(7)] == 0  # Seen before, gone now.


def test_not_supported_fields_leave_out_only_their_series():
    boards = [SimulatedGpu(index=0, uuid=uuid(0), load=steady(LOAD),
                           unsupported={f"field:{pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL}",
                                        f"field:{pynvml.NVML_FI_DEV_REMAPPED_PENDING}",
                                        "nvmlDeviceGetViolationStatus", "nvmlDeviceGetCurrentClocksEventReasons"},
                           nvlinks=0)]
    collection = GpuCollector(NvmlSession(SimulatedNvml(boards))).collect()
    samples = rendered(collection)
    assert collection.problems == ()
    assert gpu(0, "gpufleet_gpu_ecc_errors_total", error="corrected", scope="volatile") not in samples
    assert samples[gpu(0, "gpufleet_gpu_ecc_errors_total", error="uncorrected", scope="volatile")] == 0
    assert gpu(0, "gpufleet_gpu_row_remap_pending") not in samples
    assert samples[gpu(0, "gpufleet_gpu_row_remap_failed")] == 0
    for name in ("gpufleet_gpu_violation_seconds_total", "gpufleet_gpu_clock_event_active", "gpufleet_gpu_nvlink_up",
                 "gpufleet_gpu_nvlink_links", "gpufleet_gpu_nvlink_errors_total",
                 "gpufleet_gpu_nvlink_transmit_bytes_total"):
        assert not named(samples, name), name


def test_pre_ampere_boards_report_retired_pages():
    board = SimulatedGpu(index=0, uuid=uuid(0), load=steady(LOAD), name="Tesla V100-SXM2-32GB", unsupported=set(),
                         retired_pages={"single_bit": 2, "double_bit": 1}, retired_pages_pending=True)
    samples = rendered(GpuCollector(NvmlSession(SimulatedNvml([board]))).collect())
    assert samples[gpu(0, "gpufleet_gpu_retired_pages", cause="single_bit")] == 2
    assert samples[gpu(0, "gpufleet_gpu_retired_pages", cause="double_bit")] == 1
    assert samples[gpu(0, "gpufleet_gpu_retired_pages_pending")] == 1
