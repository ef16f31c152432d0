"""The simulator's repairs (a GPU reset, a node reboot, a board replaced) end what they fix and nothing else, as
the exporter on the repaired node reports it: the recovery action it holds, the counts a reset clears, the
identity of a new board."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.simulator.fleet import Fleet
from gpufleet.xid import Action

from fleets import SLOW, Probe, value
from helpers import parse


@pytest.fixture
def probe_of():
    probes = []

    def make(*entries: dict) -> Probe:
        probes.append(Probe(*entries))
        probes[-1].fleet.start()  # Each exporter's XID watcher, as the simulator runs them.
        return probes[-1]

    yield make
    for probe in probes:
        probe.close()


def actions(samples: dict) -> dict[str, float]:
    """Each GPU's recovery action, by index."""
    return {dict(labels)["gpu"]: v for (name, labels), v in samples.items() if name == "gpufleet_gpu_recovery_action"}


async def held(probe: Probe, t: float, gpu: str, action: Action) -> dict:
    """The node's scrape at `t` once GPU `gpu` is held at `action`: an XID reaches the exporter through its
    event thread, a moment after the collection that raised it."""
    for _ in range(50):
        samples = await probe.at(SLOW, t)
        if actions(samples).get(gpu) == action:
            return samples
        await asyncio.sleep(0.02)
    raise AssertionError(f"GPU {gpu} never held at {action.name}: {actions(samples)}")


def uuid_of(samples: dict, gpu: str) -> str:
    return next(dict(labels)["uuid"] for (name, labels) in samples
                if name == "gpufleet_gpu_info" and dict(labels)["gpu"] == gpu)


async def test_a_reset_ends_a_double_bit_error_and_nothing_else(probe_of):
    probe = probe_of({"kind": "ecc_dbe", "node": SLOW, "gpu": 1, "start": 10},
                     {"kind": "row_remap_failure", "node": SLOW, "gpu": 2, "start": 10},
                     {"kind": "gpu_reset", "node": SLOW, "gpu": 1, "start": 100},
                     {"kind": "gpu_reset", "node": SLOW, "gpu": 2, "start": 100})
    await probe.at(SLOW, 0)
    held = await probe.at(SLOW, 50)
    assert actions(held)["1"] == Action.RESET and actions(held)["2"] == Action.REPLACE
    assert value(held, "gpufleet_gpu_driver_recovery_action", gpu="1") == 1
    during = await probe.at(SLOW, 102)  # Off the bus while it resets.
    assert value(during, "gpufleet_gpu_up", gpu="1") == 0
    after = await probe.at(SLOW, 110)
    assert actions(after)["1"] == Action.NONE
    assert value(after, "gpufleet_gpu_ecc_errors_total", gpu="1", error="uncorrected", scope="volatile") == 0
    assert value(after, "gpufleet_gpu_ecc_errors_total", gpu="1", error="uncorrected", scope="aggregate") == 1
    assert actions(after)["2"] == Action.REPLACE  # A reset does not mend a board that cannot remap rows.


async def test_a_reboot_brings_a_lost_gpu_back_with_a_new_boot_time_and_exporter(probe_of):
    probe = probe_of({"kind": "gpu_lost", "node": SLOW, "gpu": 5, "start": 10},
                     {"kind": "node_reboot", "node": SLOW, "start": 100})
    await probe.at(SLOW, 0)
    lost = await held(probe, 50, "5", Action.REBOOT)  # Its XID 79.
    assert value(lost, "gpufleet_gpu_up", gpu="5") == 0
    node = probe.fleet.nodes[SLOW]
    assert node.state.restarting_at(130)
    before = node.state.boot_time()
    back = await probe.at(SLOW, 170)
    assert node.state.boot_time() == before + 160
    assert value(back, "gpufleet_gpu_up", gpu="5") == 1
    assert set(actions(back).values()) == {Action.NONE}
    assert value(back, "gpufleet_gpu_xid_errors_total", gpu="5", xid="79") == 1  # Kept across the restart.


async def test_a_new_board_ends_a_failed_row_remap_and_shows_another_uuid(probe_of):
    probe = probe_of({"kind": "row_remap_failure", "node": SLOW, "gpu": 3, "start": 10},
                     {"kind": "node_reboot", "node": SLOW, "start": 100},
                     {"kind": "gpu_replace", "node": SLOW, "gpu": 3, "start": 300})
    await probe.at(SLOW, 0)
    failed = await probe.at(SLOW, 50)
    old = uuid_of(failed, "3")
    assert actions(failed)["3"] == Action.REPLACE
    rebooted = await probe.at(SLOW, 200)
    assert actions(rebooted)["3"] == Action.REPLACE and uuid_of(rebooted, "3") == old
    replaced = await probe.at(SLOW, 400)
    assert uuid_of(replaced, "3") != old
    assert actions(replaced)["3"] == Action.NONE
    assert value(replaced, "gpufleet_gpu_row_remap_failed", gpu="3") == 0


async def test_a_gpu_taken_out_leaves_the_node_with_one_fewer_after_its_reboot(probe_of):
    probe = probe_of({"kind": "gpu_removed", "node": SLOW, "gpu": 3, "start": 100})
    before = await probe.at(SLOW, 50)
    removed = uuid_of(before, "3")
    after = await probe.at(SLOW, 200)
    assert value(after, "gpufleet_gpu_devices") == 7
    assert value(after, "gpufleet_gpu_pci_devices") == 7  # Off the bus too: not a GPU NVML lost.
    assert removed not in {dict(labels)["uuid"] for (name, labels) in after if name == "gpufleet_gpu_info"}
    assert set(actions(after).values()) == {Action.NONE}


async def test_a_storage_hca_is_of_another_model_and_known_at_its_own_rate():
    fleet = Fleet(node_count=2, seed=1, storage_hca=True)
    try:
        samples = parse(await fleet.nodes["gpu-node-0001"].scrape(10.0, iter(range(0, 10**6, 100)).__next__))
    finally:
        fleet.close()
    assert value(samples, "gpufleet_infiniband_rate_bytes_per_second", device="mlx5_8") == 25e9
    assert value(samples, "gpufleet_infiniband_rate_capability_bytes_per_second", device="mlx5_8") == 25e9
    assert value(samples, "gpufleet_infiniband_rate_capability_bytes_per_second", device="mlx5_0") == 50e9
    assert value(samples, "gpufleet_infiniband_info", device="mlx5_8", hca_type="MT4123") == 1


async def test_a_hung_driver_serves_only_the_held_actions_until_the_reboot_that_ends_it(probe_of):
    probe = probe_of({"kind": "ecc_dbe", "node": SLOW, "gpu": 1, "start": 10},
                     {"kind": "driver_hang", "node": SLOW, "start": 20},
                     {"kind": "node_reboot", "node": SLOW, "start": 100})
    await probe.at(SLOW, 0)
    assert actions(await probe.at(SLOW, 15))["1"] == Action.RESET
    hung = await probe.at(SLOW, 50)
    assert value(hung, "gpufleet_gpu_driver_up") == 0
    assert value(hung, "gpufleet_collector_success", collector="gpu") == 0
    assert actions(hung)["1"] == Action.RESET  # Held through the hang, not dropped with the readings.
    assert not [name for name, _ in hung if name in ("gpufleet_gpu_up", "gpufleet_gpu_power_watts")]
    node = probe.fleet.nodes[SLOW]
    assert any("Xid (PCI:" in message and ": 119," in message for message in node.kernel_log.messages)
    back = await probe.at(SLOW, 200)
    assert value(back, "gpufleet_gpu_driver_up") == 1
    assert set(actions(back).values()) == {Action.NONE}


async def test_a_reset_of_its_gpu_ends_a_hung_driver_and_is_seen(probe_of):
    probe = probe_of({"kind": "driver_hang", "node": SLOW, "gpu": 2, "start": 20},
                     {"kind": "gpu_reset", "node": SLOW, "gpu": 2, "start": 100})
    await probe.at(SLOW, 0)
    assert value(await probe.at(SLOW, 50), "gpufleet_gpu_driver_up") == 0
    during = await probe.at(SLOW, 102)  # The driver answers again; the GPU is off the bus while it resets.
    assert value(during, "gpufleet_gpu_driver_up") == 1 and value(during, "gpufleet_gpu_up", gpu="2") == 0
    after = await probe.at(SLOW, 110)
    assert value(after, "gpufleet_gpu_up", gpu="2") == 1 and set(actions(after).values()) == {Action.NONE}


async def test_a_gpu_that_a_reboot_does_not_bring_back_stays_lost_and_held(probe_of):
    probe = probe_of({"kind": "gpu_dead", "node": SLOW, "gpu": 5, "start": 10, "duration": 250},
                     {"kind": "node_reboot", "node": SLOW, "start": 100},
                     {"kind": "node_reboot", "node": SLOW, "start": 300})
    await probe.at(SLOW, 0)
    await held(probe, 50, "5", Action.REBOOT)
    rebooted = await probe.at(SLOW, 200)  # A new exporter process, which only its state tells of GPU 5.
    assert value(rebooted, "gpufleet_gpu_up", gpu="5") == 0
    assert actions(rebooted)["5"] == Action.REBOOT
    reseated = await probe.at(SLOW, 400)  # The board reseated, and the node rebooted again.
    assert value(reseated, "gpufleet_gpu_up", gpu="5") == 1 and set(actions(reseated).values()) == {Action.NONE}


async def test_a_fatal_sxid_holds_every_gpu_through_one_gpus_reset_until_the_whole_board_is_reset(probe_of):
    probe = probe_of({"kind": "sxid_fatal", "node": SLOW, "start": 10},
                     {"kind": "gpu_reset", "node": SLOW, "gpu": 3, "start": 100},
                     {"kind": "board_reset", "node": SLOW, "start": 200})
    await probe.at(SLOW, 0)
    samples = await held(probe, 50, "0", Action.RESET)
    assert set(actions(samples).values()) == {Action.RESET} and len(actions(samples)) == 8
    reasons = {dict(labels)["reason"] for (name, labels) in samples if name == "gpufleet_gpu_recovery_action_reason"}
    assert reasons == {"fatal SXid 24007 on NVSwitch 0000:05:00.0: reset the whole board"}
    one_reset = await probe.at(SLOW, 110)
    assert value(one_reset, "gpufleet_gpu_up", gpu="3") == 1 and set(actions(one_reset).values()) == {Action.RESET}
    during = await probe.at(SLOW, 202)  # Every GPU off the bus while the board resets.
    assert {value(during, "gpufleet_gpu_up", gpu=str(gpu)) for gpu in range(8)} == {0}
    after = await probe.at(SLOW, 210)
    assert set(actions(after).values()) == {Action.NONE}
    # The switch's count is the node's since it booted, as the driver logged it: the reset does not take it back.
    assert value(after, "gpufleet_nvswitch_sxid_errors_total", switch="0000:05:00.0", sxid="24007",
                 **{"class": "fatal"}) == 1
