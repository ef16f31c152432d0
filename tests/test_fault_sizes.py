"""Fault sizes and straggler causes: each size sets the rate, level or period a fault shows, and each cause
leaves the evidence its kind of slowness would leave on a real node.

Counters are exact integrals of the simulated workload, so a rate measured over whole training steps is
the model's own figure, to rounding. Gauges are averaged over instants spread evenly across whole steps.
"""

from __future__ import annotations

import itertools

import pytest

from gpufleet.simulator.faults import Fault, ScenarioError, parse_fault
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.layout import Job

from fleets import NODES, PEER, SLOW, START, Probe, value
from helpers import parse


@pytest.mark.parametrize("cause", ["clock", "thermal", "power"])
async def test_a_straggler_with_capped_clocks_computes_slower_by_its_slowdown(cause):
    """The job's step takes `slowdown` longer; the straggler's clocks fall by the share its computing grew."""
    fleet = Probe({"kind": "straggler", "node": SLOW, "slowdown": 0.1, "cause": cause})
    try:
        step = 44.0  # 40 s, 10 % longer.
        slow = await fleet.mean(SLOW, "gpufleet_gpu_clock_hertz", step, clock="sm")
        peer = await fleet.mean(PEER, "gpufleet_gpu_clock_hertz", step, clock="sm")
        assert slow / peer == pytest.approx(28 / 32, abs=0.015)  # 28 s of computing stretched to 32 s.
        samples = await fleet.at(SLOW, START)
        reasons = {dict(labels)["reason"] for (name, labels), v in samples.items()
                   if name == "gpufleet_gpu_clock_event_active" and v == 1}
        assert reasons == {"clock": set(), "thermal": {"sw_thermal_slowdown"},
                           "power": {"hw_power_brake_slowdown", "hw_slowdown"}}[cause]
        margin = min(v for (n, _), v in samples.items() if n == "gpufleet_gpu_thermal_margin_celsius")
        assert (margin < 2) == (cause == "thermal")
    finally:
        fleet.close()


async def test_a_nic_straggler_congests_its_port_and_its_gpus_look_like_their_peers():
    fleet = Probe({"kind": "straggler", "node": SLOW, "slowdown": 0.15, "cause": "nic", "port": "mlx5_2/1"})
    try:
        step = 46.0
        wait = await fleet.per_second(SLOW, "gpufleet_infiniband_port_xmit_wait_total", 10 * step, device="mlx5_2")
        assert wait == pytest.approx(150e6 * 6 / 46, rel=0.02)  # Waiting 6 s of every 46.
        for device, node in (("mlx5_0", SLOW), ("mlx5_2", PEER)):
            assert await fleet.per_second(node, "gpufleet_infiniband_port_xmit_wait_total", 10 * step,
                                    device=device) < 20_000
        slow = await fleet.mean(SLOW, "gpufleet_gpu_utilization_ratio", step)
        peer = await fleet.mean(PEER, "gpufleet_gpu_utilization_ratio", step)
        assert slow == pytest.approx(peer, abs=0.02)
    finally:
        fleet.close()


@pytest.mark.parametrize("cause", ["pcie", "host"])
async def test_a_stalled_straggler_idles_while_its_peers_wait_busy(cause):
    fleet = Probe({"kind": "straggler", "node": SLOW, "slowdown": 0.15, "cause": cause, "gpu": 5})
    try:
        step = 46.0
        slow = await fleet.sampled_mean(SLOW, "gpufleet_gpu_utilization_ratio", step)
        peer = await fleet.sampled_mean(PEER, "gpufleet_gpu_utilization_ratio", step)
        # The peers spin at 90 % for the 6 s in which the straggler's GPUs run nothing.
        assert peer - slow == pytest.approx(0.9 * 6 / 46, abs=0.005)
        samples = await fleet.at(SLOW, START)
        widths = {dict(labels)["gpu"]: v for (n, labels), v in samples.items() if n == "gpufleet_gpu_pcie_link_width"}
        assert widths == {str(gpu): (8 if cause == "pcie" and gpu == 5 else 16) for gpu in range(8)}
    finally:
        fleet.close()


async def test_the_slowest_straggler_sets_the_pace_and_a_lesser_one_waits_for_it():
    fleet = Probe({"kind": "straggler", "node": SLOW, "slowdown": 0.2},
                       {"kind": "straggler", "node": NODES[2], "slowdown": 0.1})
    try:
        step = 48.0
        energy = {node: await fleet.per_second(node, "gpufleet_gpu_energy_joules_total", 10 * step)
                  for node in NODES}
        # Every node's step is 48 s: each draws the same energy per step as its own cycle says, whatever it is.
        assert energy[PEER] == pytest.approx(energy[NODES[3]], rel=0.03)
        assert energy[SLOW] < energy[NODES[2]] < energy[PEER]
    finally:
        fleet.close()


@pytest.mark.parametrize(("fault", "metric", "labels", "expected"), [
    ({"kind": "nic_saturation", "port": "mlx5_1/1", "level": 0.5}, "gpufleet_infiniband_port_xmit_data_bytes_total",
     {"device": "mlx5_1"}, 0.5 * 50e9),
    ({"kind": "nic_saturation", "port": "eth1", "direction": "rx", "level": 0.6},
     "gpufleet_network_receive_bytes_total", {"device": "eth1"}, 0.6 * 12.5e9),
    ({"kind": "pcie_replay_storm", "gpu": 2, "rate": 3}, "gpufleet_gpu_pcie_replays_total", {"gpu": "2"}, 3),
    ({"kind": "nvlink_crc", "gpu": 1, "link": 7, "rate": 40}, "gpufleet_gpu_nvlink_link_errors_total",
     {"gpu": "1", "link": "7", "error": "crc_flit"}, 40),
    ({"kind": "ib_congestion", "port": "mlx5_4/1", "rate": 2e6}, "gpufleet_infiniband_port_xmit_wait_total",
     {"device": "mlx5_4"}, 2e6),
    ({"kind": "symbol_errors", "port": "mlx5_3/1", "rate": 0.5}, "gpufleet_infiniband_symbol_error_total",
     {"device": "mlx5_3"}, 0.5),
    ({"kind": "ib_link_flap", "port": "mlx5_5/1", "period": "2m"}, "gpufleet_infiniband_link_downed_total",
     {"device": "mlx5_5"}, 1 / 120),
])
async def test_each_size_sets_the_rate_its_counter_grows_at(fault, metric, labels, expected):
    fleet = Probe({"node": PEER, **fault})
    try:
        # Over whole steps of 40 s: a saturated port's level is all its traffic, the job's included.
        assert await fleet.per_second(PEER, metric, 1200.0, **labels) == pytest.approx(expected, rel=0.03)
    finally:
        fleet.close()


@pytest.mark.parametrize(("entry", "message"), [
    ({"kind": "xid", "gpu": 0, "xid": 13, "slowdown": 0.1}, "kind xid takes no slowdown"),
    ({"kind": "nic_saturation", "port": "eth1", "rate": 5}, "kind nic_saturation takes no rate"),
    ({"kind": "straggler", "slowdown": 0}, "slowdown must be a number above 0 and at most 4"),
    ({"kind": "straggler", "slowdown": "fast"}, "slowdown must be a number"),
    ({"kind": "nic_saturation", "port": "eth1", "level": 1.2}, "level must be a number above 0 and at most 1"),
    ({"kind": "straggler", "cause": "fan"}, "cause must be one of clock, thermal, power, nic, pcie, host"),
    ({"kind": "ib_congestion", "port": "mlx5_0/1", "cause": "nic"}, "kind ib_congestion takes no cause"),
    ({"kind": "straggler", "cause": "nic", "port": "eth1"}, "a straggler's port is the InfiniBand port"),
    ({"kind": "ib_link_flap", "port": "mlx5_0/1", "period": "often"}, "period: invalid duration 'often'"),
])
def test_a_bad_size_or_cause_names_the_field(entry, message):
    fleet = Fleet(node_count=1, gpus_per_node=8, layout=[])
    try:
        with pytest.raises(ScenarioError, match=message):
            parse_fault({"node": "gpu-node-0001", **entry}, "fault 1", "f1", fleet.nodes, 8)
    finally:
        fleet.close()


def test_sizes_left_out_are_the_sizes_always_documented():
    fleet = Fleet(node_count=1, gpus_per_node=8, layout=[])
    try:
        def size(**entry) -> float:
            return parse_fault({"node": "gpu-node-0001", **entry}, "f", "f1", fleet.nodes, 8).size
        assert size(kind="straggler") == 0.4
        assert size(kind="nic_saturation", port="eth1") == 0.97
        assert size(kind="ib_link_flap", port="mlx5_0/1") == 20
        assert size(kind="ib_link_flap", port="mlx5_0/1", period="1m") == 60
        assert size(kind="gpu_lost", gpu=0) == 0
    finally:
        fleet.close()


@pytest.mark.slow
async def test_a_down_ports_byte_counters_never_step_back_while_faults_elsewhere_split_the_timeline():
    """A down port's count is a difference of integrals that rounding moved by a byte either way when a straggler
    was added to its job; Prometheus read each step back as a counter reset and paged NicSaturated on the port."""
    nodes = tuple(f"gpu-node-000{i}" for i in range(1, 5))
    fleet = Fleet(node_count=4, gpus_per_node=8, seed=0, layout=[Job("1", "slurm", nodes, 37.3, 0.27, 0.8)])
    wall = itertools.count(0, 100).__next__
    try:
        fleet.add([Fault("down", "ib_link_down", nodes[0], 60.3, port="mlx5_4/1")])
        counts, t = [], 61.0
        for step in range(240):
            t += 1.7
            if step % 40 == 20:  # A straggler on a peer rebuilds the job's timeline at its start and end.
                fleet.add([Fault(f"slow{step}", "straggler", nodes[1], t + 0.37, 30.0)])
            samples = parse(await fleet.nodes[nodes[0]].scrape(t, wall))
            counts.append(value(samples, "gpufleet_infiniband_port_xmit_data_bytes_total", device="mlx5_4"))
    finally:
        fleet.close()
    assert counts == sorted(counts)
