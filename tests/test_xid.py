"""The kernel-log XID parser and reader, the ledger that keeps NVML and kernel-log XIDs from double counting, and
the NVML event watcher's recovery verdicts."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pynvml

from gpufleet.devtools.nodes import UUID0, UUID1, FakeClock, two_boards
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.xid import KernelLogXids, NvmlXidWatcher, XidLedger, parse_xid_line, pci_key
from gpufleet.exporter.kernellog import DevKmsg

from helpers import eventually

FIXTURE_LOG = Path(__file__).parent / "fixtures" / "kmsg" / "xid.log"


def test_the_parser_finds_every_nvrm_xid_line_and_nothing_else():
    parsed = [parse_xid_line(line) for line in FIXTURE_LOG.read_text().splitlines()]
    assert [p for p in parsed if p is not None] == [
        ((0, 0x18, 0), 79),
        ((0, 0x2A, 0), 48),
        ((0, 0x2A, 0), 63),
        ((0, 0x3A, 0), 13),
        ((0, 0x3A, 0), 13),
        ((0, 0x5D, 0), 31),  # The old format, without "PCI:".
        ((0, 0xDB, 0), 119),
    ]
    # mlx5, amdgpu, the "fallen off the bus" follow-up, a malformed bus id and a line without a code are ignored.
    assert parsed.count(None) == 5


def test_nvml_and_kernel_bus_ids_name_the_same_gpu():
    assert pci_key("00000000:18:00.0") == pci_key("0000:18:00") == (0, 0x18, 0)
    assert pci_key("0001:2A:00.0") == (1, 0x2A, 0)
    assert pci_key("garbage") is None


def ledger_with_two_gpus(clock):
    ledger = XidLedger(clock=clock, dedup_window=10.0)
    ledger.register_gpu(0, "GPU-a", "00000000:18:00.0")
    ledger.register_gpu(1, "GPU-b", "00000000:2A:00.0")
    return ledger


def counts(ledger):
    return {(c.gpu, c.xid): c.count for c in ledger.snapshot()}


def test_an_xid_reported_by_nvml_and_the_kernel_log_counts_once():
    clock = FakeClock()
    ledger = ledger_with_two_gpus(clock)
    ledger.record_nvml(0, "GPU-a", "00000000:18:00.0", 79)
    clock.now += 0.4
    ledger.record_kmsg((0, 0x18, 0), 79)
    clock.now += 30
    assert counts(ledger) == {(0, 79): 1}


def test_kernel_log_first_then_nvml_still_counts_once():
    clock = FakeClock()
    ledger = ledger_with_two_gpus(clock)
    ledger.record_kmsg((0, 0x18, 0), 48)
    clock.now += 2
    ledger.record_nvml(0, "GPU-a", "00000000:18:00.0", 48)
    clock.now += 30
    assert counts(ledger) == {(0, 48): 1}


def test_an_xid_only_the_kernel_saw_counts_after_the_window():
    clock = FakeClock()
    ledger = ledger_with_two_gpus(clock)
    ledger.record_kmsg((0, 0x2A, 0), 79)  # NVML went down with the GPU and never reported it.
    clock.now += 5
    assert counts(ledger) == {}
    clock.now += 5
    snapshot = ledger.snapshot()
    assert [(c.gpu, c.uuid, c.xid, c.count) for c in snapshot] == [(1, "GPU-b", 79, 1)]
    assert snapshot[0].last_timestamp == 1_800_000_000.0


def test_repeats_are_not_swallowed_by_the_deduplication():
    clock = FakeClock()
    ledger = ledger_with_two_gpus(clock)
    for _ in range(2):  # Two XID 13 on one GPU, each seen by both sources.
        ledger.record_nvml(1, "GPU-b", "00000000:2A:00.0", 13)
        ledger.record_kmsg((0, 0x2A, 0), 13)
        clock.now += 1
    ledger.record_kmsg((0, 0x2A, 0), 13)  # A third only the kernel saw.
    clock.now += 30
    assert counts(ledger) == {(1, 13): 3}


def test_an_xid_on_a_gpu_nvml_never_listed_is_not_counted(caplog):
    clock = FakeClock()
    ledger = ledger_with_two_gpus(clock)
    ledger.record_kmsg((0, 0xDB, 0), 119)
    clock.now += 30
    assert counts(ledger) == {}
    assert "PCI 0000:db:00, a GPU NVML never listed" in caplog.text


def test_the_reader_follows_a_growing_log_from_its_end(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(FIXTURE_LOG.read_text())  # History from before the exporter started: not counted.
    ledger = XidLedger(dedup_window=0.0)
    ledger.register_gpu(0, "GPU-a", "00000000:18:00.0")
    ledger.register_gpu(2, "GPU-c", "00000000:3A:00.0")
    reader = KernelLogXids(DevKmsg(str(log)), ledger)
    reader.start()
    try:
        with log.open("a") as handle:
            handle.write("4,3001,1600000000,-;NVRM: Xid (PCI:0000:3a:00): 94, pid=9, Contained ECC error.\n")
            handle.write("4,3002,1600000001,-;NVRM: Xid (PCI:0000:3a:00): 94, pid=9, Contained ECC error.\n")
            handle.write("4,3003,1600000002,-;NVRM: Xid (PCI:0000:18:00): 4")  # Written in two parts.
            handle.flush()
            reader.poll()  # The XID 94s, and the half line after them, which waits for its end.
            assert counts(ledger) == {(2, 94): 2}
            handle.write("3, pid=9, Uncontained ECC error.\n")
        reader.poll()
        assert counts(ledger) == {(2, 94): 2, (0, 43): 1}
    finally:
        reader.close()


def test_the_reader_survives_a_missing_log_and_picks_it_up_later(tmp_path, caplog):
    log = tmp_path / "kmsg"
    ledger = XidLedger(dedup_window=0.0)
    ledger.register_gpu(0, "GPU-a", "00000000:18:00.0")
    reader = KernelLogXids(DevKmsg(str(log)), ledger)
    caplog.set_level(logging.WARNING, logger="gpufleet.exporter.gpu.xid")
    reader.start()
    reader.poll()
    assert caplog.text.count("kernel log unreadable for XIDs") == 1  # Said once, however often it is tried.
    log.write_text("")
    reader.poll()  # Opened, at its end.
    with log.open("a") as handle:
        handle.write("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    reader.poll()
    assert counts(ledger) == {(0, 79): 1}
    reader.close()


@contextlib.asynccontextmanager
async def watching(nvml: SimulatedNvml) -> AsyncIterator[XidLedger]:
    """The NVML event watcher running on `nvml` once it has registered, and the ledger it records in."""
    ledger = XidLedger()
    watcher = NvmlXidWatcher(nvml, ledger, wait_ms=20, backoff_initial=0.05, backoff_max=0.2)
    watcher.start()
    try:
        async def registered():
            return ledger.watching
        await eventually(registered)
        yield ledger
    finally:
        await asyncio.to_thread(watcher.stop)


async def test_the_watcher_reads_the_drivers_recovery_verdict_where_the_driver_announces_it():
    boards = two_boards()
    boards[1].unsupported.add(f"field:{pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION}")  # An older driver on board 1.
    nvml = SimulatedNvml(boards)
    async with watching(nvml) as ledger:
        nvml.set_recovery_action(0, pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET)
        nvml.set_recovery_action(1, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)  # No event on the older driver.
        nvml.inject_xid(1, 13)  # Whose XIDs still arrive: asking for the event it lacks did not cost them.

        async def seen():
            return ledger.snapshot() and ledger.take_verdicts()
        assert await eventually(seen) == {UUID0: [pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET]}
        assert [(x.uuid, x.xid, x.count) for x in ledger.snapshot()] == [(UUID1, 13, 1)]
        assert ledger.take_verdicts() == {}


async def test_a_gpu_whose_recovery_event_cannot_be_had_keeps_its_xid_events(monkeypatch):
    """Board 0's driver fails the probe of its event types; board 1's says it has the recovery-action event and
    then refuses it at registration."""
    boards = two_boards()
    boards[0].errors["nvmlDeviceGetSupportedEventTypes"] = pynvml.NVML_ERROR_UNKNOWN
    nvml = SimulatedNvml(boards)
    register = nvml.nvmlDeviceRegisterEvents

    def refusing(handle, event_types, event_set):
        if handle.gpu.index == 1 and event_types & pynvml.nvmlEventTypeGpuRecoveryAction:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        register(handle, event_types, event_set)
    monkeypatch.setattr(nvml, "nvmlDeviceRegisterEvents", refusing)
    async with watching(nvml) as ledger:
        nvml.inject_xid(0, 31)
        nvml.inject_xid(1, 13)

        async def counted():
            return len(ledger.snapshot()) == 2
        await eventually(counted)
        assert [(x.uuid, x.xid) for x in ledger.snapshot()] == [(UUID0, 31), (UUID1, 13)]
