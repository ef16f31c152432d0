"""The fleet simulator: every fault kind changes exactly the series it should, and nothing else.

Two fleets with the same seed report identical values at the same simulated
time, so each fault is measured as the difference between a fleet with it and a
twin without it, scraped through the exporter's own collectors.
"""

import asyncio
import itertools

import pytest

from gpufleet.exporter import node as exporter_node
from gpufleet.exporter.collector.kernel import EVENTS, classify
from gpufleet.simulator.faults import OLDER_DRIVER, ScenarioError, load_scenario, parse_fault
from gpufleet.simulator.fleet import Fleet, collector_flags
from gpufleet.simulator.kernel_log import MESSAGES
from gpufleet.simulator.layout import Job, LayoutError, load_layout

from fleets import value
from helpers import eventually, parse

NOW = 300.0  # Simulated seconds; every fault below starts at 100 s unless it says otherwise.
JOB = Job("424242", "slurm", ("gpu-node-0001", "gpu-node-0002"), period=40.0, comm_fraction=0.3, memory_fraction=0.7)
# Values that differ between any two collections (timings, timestamps, the process itself).
VOLATILE = ("gpufleet_collector_duration_seconds", "gpufleet_collector_last_success_timestamp_seconds",
            "gpufleet_gpu_xid_last_timestamp_seconds", "process_", "python_")


def make_fleet() -> Fleet:
    return Fleet(node_count=4, gpus_per_node=8, seed=7, layout=[JOB])


async def scrape_all(fleet: Fleet) -> dict[str, dict]:
    """Every node at simulated time NOW, once every XID its faults raised has reached its exporter.

    The first pass raises the XIDs; each node's XID watcher records them in its own thread, so the
    node is collected again until its XID counts add up to the XIDs raised.
    """
    wall = itertools.count(0, 100).__next__  # Each scrape is "100 s later": every collector runs.
    for node in fleet.nodes.values():
        await node.scrape(NOW, wall)

    async def settled() -> dict[str, dict] | None:
        scraped = {name: parse(await node.scrape(NOW, wall)) for name, node in fleet.nodes.items()}
        counted = {name: sum(v for (n, _), v in samples.items() if n == "gpufleet_gpu_xid_errors_total")
                   for name, samples in scraped.items()}
        return scraped if all(counted[name] == len(node.fired) for name, node in fleet.nodes.items()) else None

    return await eventually(settled, timeout=10, interval=0.05)


def differences(before: dict, after: dict) -> set[tuple[str, frozenset]]:
    keys = {k for k in before.keys() | after.keys() if not k[0].startswith(VOLATILE)}
    return {k for k in keys if before.get(k) != after.get(k)}


@pytest.fixture(scope="module")
def baseline():
    fleet = make_fleet()
    fleet.start()
    try:
        yield asyncio.run(scrape_all(fleet))
    finally:
        fleet.close()


async def with_faults(*entries: dict) -> dict[str, dict]:
    fleet = make_fleet()
    ids = itertools.count(1)
    fleet.add([parse_fault({"start": 100, **entry}, "test", f"t{next(ids)}", fleet.nodes, 8) for entry in entries])
    fleet.start()
    try:
        return await scrape_all(fleet)
    finally:
        fleet.close()


def changed(baseline, faulted, node="gpu-node-0003"):
    """The changed series on `node`, after checking that no other node changed at all."""
    for name in faulted:
        if name != node:
            assert differences(baseline[name], faulted[name]) == set(), name
    return differences(baseline[node], faulted[node])


# Node series a GPU's fault may move: a collection's success, and the node's power meter, which holds its GPUs'.
NODE_WIDE = {"gpufleet_collector_success", "gpufleet_hwmon_power_watts"}


def names(diff, **labels):
    """Metric names among the differences, each checked to carry the given labels."""
    for name, series_labels in diff:
        assert set(labels.items()) <= series_labels or name in NODE_WIDE, (name, series_labels)
    return {name for name, _ in diff}


async def test_same_seed_same_time_same_values(baseline):
    assert changed(baseline, await with_faults()) == set()


async def test_every_node_runs_every_collector_the_exporter_has(baseline):
    """The simulator's nodes are built by the exporter's own code: a collector added there is served here."""
    for samples in baseline.values():
        served = {dict(labels)["collector"] for name, labels in samples if name == "gpufleet_collector_success"}
        assert served == {collector.name for collector in exporter_node.COLLECTORS}


async def test_the_healthy_fleet_is_healthy(baseline):
    node = baseline["gpu-node-0001"]
    assert node[("gpufleet_gpu_devices", frozenset())] == 8
    assert all(v == 1 for (n, _), v in node.items() if n == "gpufleet_collector_success")
    jobs = {dict(l)["job_id"] for (n, l) in node if n == "gpufleet_gpu_job_info"}
    assert jobs == {"424242"}
    assert not [k for k in baseline["gpu-node-0003"] if k[0] == "gpufleet_gpu_job_info"]  # An idle node.
    assert not [k for k in node if k[0] == "gpufleet_gpu_xid_errors_total"]


@pytest.mark.parametrize(("fault", "expected"), [
    ({"kind": "xid", "gpu": 2, "xid": 13}, {"gpufleet_gpu_xid_errors_total"}),
    # Each with the reset or new board it calls for, and the driver's own verdict where it gives one.
    ({"kind": "ecc_dbe", "gpu": 2}, {"gpufleet_gpu_ecc_errors_total", "gpufleet_gpu_xid_errors_total",
                                     "gpufleet_gpu_recovery_action", "gpufleet_gpu_recovery_action_reason",
                                     "gpufleet_gpu_driver_recovery_action"}),
    # Contained: the driver asks for nothing, and the exporter defers the reset to the next drain.
    ({"kind": "ecc_contained", "gpu": 2},
     {"gpufleet_gpu_ecc_errors_total", "gpufleet_gpu_xid_errors_total", "gpufleet_gpu_remapped_rows",
      "gpufleet_gpu_row_remap_pending", "gpufleet_gpu_recovery_action", "gpufleet_gpu_recovery_action_reason",
      "gpufleet_gpu_recovery_action_deferred"}),
    ({"kind": "row_remap_pending", "gpu": 2}, {"gpufleet_gpu_remapped_rows", "gpufleet_gpu_row_remap_pending"}),
    ({"kind": "row_remap_failure", "gpu": 2},
     {"gpufleet_gpu_remapped_rows", "gpufleet_gpu_row_remap_failed", "gpufleet_gpu_xid_errors_total",
      "gpufleet_gpu_recovery_action", "gpufleet_gpu_recovery_action_reason"}),
    ({"kind": "pcie_replay_storm", "gpu": 2}, {"gpufleet_gpu_pcie_replays_total"}),
    ({"kind": "nvlink_crc", "gpu": 2, "link": 5},
     {"gpufleet_gpu_nvlink_errors_total", "gpufleet_gpu_nvlink_link_errors_total"}),
    ({"kind": "nvlink_down", "gpu": 2, "link": 5},
     {"gpufleet_gpu_nvlink_up", "gpufleet_gpu_nvlink_links_up", "gpufleet_gpu_nvlink_transmit_bytes_total",
      "gpufleet_gpu_nvlink_receive_bytes_total"}),
    ({"kind": "thermal_slowdown", "gpu": 2},
     {"gpufleet_gpu_temperature_celsius", "gpufleet_gpu_memory_temperature_celsius",
      "gpufleet_gpu_thermal_margin_celsius", "gpufleet_gpu_clock_hertz", "gpufleet_gpu_power_watts",
      "gpufleet_gpu_energy_joules_total", "gpufleet_gpu_nvlink_transmit_bytes_total",
      "gpufleet_gpu_nvlink_receive_bytes_total", "gpufleet_gpu_clock_event_active",
      "gpufleet_gpu_violation_seconds_total", "gpufleet_hwmon_power_watts"}),
    # With ECC off the GPU counts no ECC errors, and the exporter reports none rather than zero.
    ({"kind": "ecc_disabled", "gpu": 2},
     {"gpufleet_gpu_ecc_enabled", "gpufleet_gpu_ecc_pending_enabled", "gpufleet_gpu_ecc_errors_total"}),
    ({"kind": "persistence_off", "gpu": 2}, {"gpufleet_gpu_persistence_mode_enabled"}),
    # Its energy counter keeps counting from where it was: only its draw since the cap is lower.
    ({"kind": "power_capped", "gpu": 2},
     {"gpufleet_gpu_power_limit_watts", "gpufleet_gpu_power_watts", "gpufleet_gpu_energy_joules_total",
      "gpufleet_gpu_nvlink_transmit_bytes_total", "gpufleet_gpu_nvlink_receive_bytes_total",
      "gpufleet_hwmon_power_watts"}),
    ({"kind": "power_brake", "gpu": 2},
     {"gpufleet_gpu_clock_hertz", "gpufleet_gpu_power_watts", "gpufleet_gpu_energy_joules_total",
      "gpufleet_gpu_nvlink_transmit_bytes_total", "gpufleet_gpu_nvlink_receive_bytes_total",
      "gpufleet_gpu_clock_event_active", "gpufleet_gpu_violation_seconds_total", "gpufleet_hwmon_power_watts"}),
])
async def test_each_gpu_fault_changes_only_its_gpus_series(baseline, fault, expected):
    diff = changed(baseline, await with_faults({"node": "gpu-node-0003", **fault}))
    assert names(diff, gpu="2") == expected


async def test_a_pcie_aer_fault_counts_on_its_gpus_link_alone_until_the_node_reboots(baseline):
    """One completion timeout at its start and correctable errors at its rate, on the link of its GPU's PCI
    address; a reboot after it starts the kernel's counts again."""
    faulted = await with_faults({"node": "gpu-node-0003", "kind": "pcie_aer", "gpu": 2, "rate": 2})
    diff = changed(baseline, faulted)
    node = faulted["gpu-node-0003"]
    address = next(dict(l)["pci_bus_id"] for (n, l) in node if n == "gpufleet_gpu_info" and ("gpu", "2") in l)
    link = address.lower().removeprefix("0000")[:-2]
    errors = {dict(l)["type"]: v for (n, l), v in node.items()
              if n == "gpufleet_pcie_aer_errors_total" and ("address", link) in l}
    assert errors == {"correctable": 2 * (NOW - 100), "nonfatal": 1, "fatal": 0}
    assert {(n, dict(l)["type"]) for n, l in diff if n.startswith("gpufleet_pcie")} == {
        ("gpufleet_pcie_aer_errors_total", "correctable"), ("gpufleet_pcie_aer_errors_total", "nonfatal")}
    assert {dict(l)["address"] for n, l in diff if n.startswith("gpufleet_pcie")} == {link}
    fleet = make_fleet()
    fleet.add([parse_fault({"node": "gpu-node-0003", **entry}, "test", f"t{i}", fleet.nodes, 8) for i, entry in
               enumerate(({"kind": "pcie_aer", "gpu": 2, "rate": 2, "start": 100},
                          {"kind": "node_reboot", "start": 200, "duration": 10}))])
    fleet.start()
    try:  # The reboot raises no XID, so one scrape is the whole node's.
        rebooted = parse(await fleet.nodes["gpu-node-0003"].scrape(NOW, itertools.count(0, 100).__next__))
    finally:
        fleet.close()
    errors = {dict(l)["type"]: v for (n, l), v in rebooted.items()
              if n == "gpufleet_pcie_aer_errors_total" and ("address", link) in l}
    assert errors == {"correctable": 2 * (NOW - 210), "nonfatal": 0, "fatal": 0}


async def test_sxid_faults_log_what_the_exporter_counts_by_switch_code_and_class(baseline):
    """Each SXid's primary line counts once, its data line not at all; the fatal one holds the board's GPUs."""
    faulted = await with_faults({"node": "gpu-node-0003", "kind": "sxid_fatal"},
                                {"node": "gpu-node-0003", "kind": "sxid_nonfatal", "rate": 0.1})
    assert {n for n, _ in changed(baseline, faulted)} == {"gpufleet_nvswitch_sxid_errors_total",
                                                          "gpufleet_gpu_recovery_action",
                                                          "gpufleet_gpu_recovery_action_reason"}
    assert {(dict(l)["switch"], dict(l)["sxid"], dict(l)["class"]): v for (n, l), v in faulted["gpu-node-0003"].items()
            if n == "gpufleet_nvswitch_sxid_errors_total"} == {
        ("0000:05:00.0", "24007", "fatal"): 1, ("0000:05:00.0", "20001", "non_fatal"): 0.1 * (NOW - 100)}


async def test_thermal_slowdown_reads_as_one(baseline):
    faulted = await with_faults({"node": "gpu-node-0003", "kind": "thermal_slowdown", "gpu": 2})
    node = faulted["gpu-node-0003"]
    gpu = {("gpu", "2"), ("uuid", next(dict(l)["uuid"] for (n, l) in node if n == "gpufleet_gpu_up"
                                        and ("gpu", "2") in l))}
    def active(samples):
        return {dict(l)["reason"] for (n, l), v in samples.items()
                if n == "gpufleet_gpu_clock_event_active" and v == 1 and gpu <= l}

    # The node is idle, so gpu_idle was on before; the fault adds the two thermal reasons.
    assert active(node) - active(baseline["gpu-node-0003"]) == {"sw_thermal_slowdown", "hw_thermal_slowdown"}
    assert node[("gpufleet_gpu_violation_seconds_total", frozenset(gpu | {("policy", "thermal")}))] == NOW - 100
    assert node[("gpufleet_gpu_thermal_margin_celsius", frozenset(gpu))] < 0


async def test_a_lost_gpu_leaves_only_up_info_and_its_xid(baseline):
    diff = changed(baseline, await with_faults({"node": "gpu-node-0003", "kind": "gpu_lost", "gpu": 4}))
    after = {n for n, l in diff if ("gpu", "4") in l}
    assert "gpufleet_gpu_up" in after and "gpufleet_gpu_xid_errors_total" in after
    assert "gpufleet_gpu_power_watts" in after  # Gone from the faulted node: its value series disappear.
    assert not [k for k in diff if ("gpu", "4") not in k[1] and k[0] != "gpufleet_collector_success"]


async def test_a_straggler_slows_itself_and_its_peers_wait_while_other_nodes_see_nothing(baseline):
    faulted = await with_faults({"node": "gpu-node-0001", "kind": "straggler"})
    for outsider in ("gpu-node-0003", "gpu-node-0004"):
        assert differences(baseline[outsider], faulted[outsider]) == set()
    for member in ("gpu-node-0001", "gpu-node-0002"):
        energy = {k for k in differences(baseline[member], faulted[member])
                  if k[0] == "gpufleet_gpu_energy_joules_total"}
        assert len(energy) == 8, member  # Every GPU of both job members draws differently from then on.


async def test_a_driver_mismatch_reboots_the_node_into_the_older_driver_for_good():
    fleet = make_fleet()
    fleet.add([parse_fault({"node": "gpu-node-0003", "kind": "driver_mismatch", "start": 100, "duration": 30},
                           "test", "t1", fleet.nodes, 8)])
    fleet.start()
    wall = itertools.count(0, 100).__next__

    async def drivers(name: str, t: float) -> set[str]:
        samples = parse(await fleet.nodes[name].scrape(t, wall))
        return {dict(labels)["driver_version"] for (metric, labels) in samples if metric == "gpufleet_gpu_info"}

    try:
        assert await drivers("gpu-node-0003", 50.0) == {"570.133.20"}
        assert await drivers("gpu-node-0003", NOW) == {OLDER_DRIVER}  # Long after its reboot ended.
        assert await drivers("gpu-node-0004", NOW) == {"570.133.20"}
    finally:
        fleet.close()


def test_each_simulated_kernel_message_is_the_event_it_stands_for():
    assert {event: classify(message) for event, message in MESSAGES.items()} == {event: event for event in EVENTS}


async def test_kernel_events_are_logged_at_their_rate_and_counted_by_event(baseline):
    faulted = await with_faults({"node": "gpu-node-0003", "kind": "kernel_events", "event": "storage_timeout",
                                 "rate": 0.1})
    key = ("gpufleet_kernel_events_total", frozenset({("event", "storage_timeout")}))
    server = ("gpufleet_kernel_storage_timeouts_total", frozenset({("server", "nfs-home")}))
    assert changed(baseline, faulted) == {key, server}
    assert faulted["gpu-node-0003"][key] == faulted["gpu-node-0003"][server] == 20  # From 100 s to 300 s, every 10 s.


async def test_a_hung_job_spins_on_every_node_and_its_failing_node_raises_its_xid(baseline):
    """Every GPU of the job the fault's node runs waits in a collective: busy to NVML, SMs nearly still, the
    tensor pipes idle; only the named node raises the XID it failed with."""
    faulted = await with_faults({"node": "gpu-node-0002", "kind": "job_hang", "gpu": 3, "xid": 43})
    for outsider in ("gpu-node-0003", "gpu-node-0004"):
        assert differences(baseline[outsider], faulted[outsider]) == set()
    for member in ("gpu-node-0001", "gpu-node-0002"):
        samples = faulted[member]
        for gpu in map(str, range(8)):
            at = {"gpu": gpu}
            assert value(samples, "gpufleet_gpu_utilization_ratio", **at) > 0.8, (member, gpu)
            assert value(samples, "gpufleet_gpu_sm_active_ratio", **at) < 0.1, (member, gpu)
            assert value(samples, "gpufleet_gpu_tensor_active_ratio", **at) == 0, (member, gpu)
        xids = {dict(labels)["gpu"] for (name, labels), count in samples.items()
                if name == "gpufleet_gpu_xid_errors_total" and dict(labels).get("xid") == "43" and count}
        assert xids == ({"3"} if member == "gpu-node-0002" else set()), member


@pytest.mark.parametrize(("fault", "expected"), [
    ({"kind": "nic_saturation", "port": "mlx5_3/1", "direction": "tx"},
     {"gpufleet_infiniband_port_xmit_data_bytes_total", "gpufleet_infiniband_port_xmit_packets_total"}),
    ({"kind": "ib_congestion", "port": "mlx5_3/1"}, {"gpufleet_infiniband_port_xmit_wait_total"}),
    ({"kind": "symbol_errors", "port": "mlx5_3/1"}, {"gpufleet_infiniband_symbol_error_total"}),
    # Down from the fleet's start, and at its first collection: never seen ACTIVE, as an uncabled port.
    ({"kind": "ib_link_down", "port": "mlx5_3/1"},
     {"gpufleet_infiniband_state_id", "gpufleet_infiniband_physical_state_id", "gpufleet_infiniband_link_downed_total",
      "gpufleet_infiniband_port_seen_active",
      "gpufleet_infiniband_port_xmit_data_bytes_total", "gpufleet_infiniband_port_rcv_data_bytes_total",
      "gpufleet_infiniband_port_xmit_packets_total", "gpufleet_infiniband_port_rcv_packets_total"}),
    ({"kind": "ib_link_flap", "port": "mlx5_3/1", "start": 295},
     {"gpufleet_infiniband_state_id", "gpufleet_infiniband_physical_state_id", "gpufleet_infiniband_link_downed_total",
      "gpufleet_infiniband_port_seen_active",
      "gpufleet_infiniband_port_xmit_data_bytes_total", "gpufleet_infiniband_port_rcv_data_bytes_total",
      "gpufleet_infiniband_port_xmit_packets_total", "gpufleet_infiniband_port_rcv_packets_total"}),
    ({"kind": "ib_rate_degraded", "port": "mlx5_3/1"}, {"gpufleet_infiniband_rate_bytes_per_second"}),
])
async def test_each_port_fault_changes_only_its_ports_series(baseline, fault, expected):
    # On a job member, so the port carries traffic that a fault can stop.
    diff = changed(baseline, await with_faults({"node": "gpu-node-0001", **fault}), node="gpu-node-0001")
    assert names(diff, device="mlx5_3", port="1") == expected


async def test_ethernet_saturation(baseline):
    diff = changed(baseline, await with_faults({"node": "gpu-node-0003", "kind": "nic_saturation", "port": "eth1",
                                                "direction": "rx"}))
    assert names(diff, device="eth1") == {"gpufleet_network_receive_bytes_total",
                                          "gpufleet_network_receive_packets_total"}


async def test_faults_end(baseline):
    faulted = await with_faults({"node": "gpu-node-0003", "kind": "row_remap_pending", "gpu": 1, "duration": 60},
                                {"node": "gpu-node-0003", "kind": "ib_link_down", "port": "mlx5_0/1", "duration": 60})
    diff = changed(baseline, faulted)
    # After its end a remap stays counted but is no longer pending. The link is up again, having gone down
    # once, and the traffic it missed while down stays missed: its byte and packet counters remain lower.
    assert names(diff) == {"gpufleet_gpu_remapped_rows", "gpufleet_infiniband_link_downed_total",
                           "gpufleet_infiniband_port_xmit_data_bytes_total",
                           "gpufleet_infiniband_port_rcv_data_bytes_total",
                           "gpufleet_infiniband_port_xmit_packets_total", "gpufleet_infiniband_port_rcv_packets_total"}


async def test_a_fleet_collected_every_second_runs_every_collector_at_each_visit():
    # A fleet collected every second stands for a faster clock; its GPUs must be read at every visit, even
    # one that comes a moment early, and not on the GPU collector's own five seconds.
    async def energy_at_visits(fleet: Fleet) -> list[float]:
        node, readings = fleet.nodes["gpu-node-0001"], []
        fleet.start()
        try:
            for visit in range(4):
                at = visit * 0.99
                samples = parse(await node.scrape(at, lambda at=at: at)).items()
                readings.append(sum(v for (name, _), v in samples if name == "gpufleet_gpu_energy_joules_total"))
        finally:
            fleet.close()
        return readings

    every_second = await energy_at_visits(Fleet(node_count=1, gpus_per_node=1, layout=[],
                                                exporter_flags=collector_flags(1.0)))
    assert every_second == sorted(set(every_second)), every_second  # A new reading at every visit.
    unconfigured = await energy_at_visits(Fleet(node_count=1, gpus_per_node=1, layout=[]))
    assert len(set(unconfigured)) == 1, unconfigured  # The exporter's own five seconds.


def test_counters_never_go_backwards_through_faults():
    fleet = make_fleet()
    ids = itertools.count(1)
    fleet.add([parse_fault(entry, "test", f"t{next(ids)}", fleet.nodes, 8) for entry in (
        {"node": "gpu-node-0001", "kind": "straggler", "start": 50, "duration": 100},
        {"node": "gpu-node-0001", "kind": "nic_saturation", "port": "mlx5_0/1", "start": 60, "duration": 30},
        {"node": "gpu-node-0001", "kind": "ib_link_flap", "port": "mlx5_1/1", "start": 70, "duration": 45},
        {"node": "gpu-node-0001", "kind": "power_brake", "gpu": 0, "start": 80, "duration": 20},
        {"node": "gpu-node-0001", "kind": "thermal_slowdown", "gpu": 1, "start": 90, "duration": 20},
        {"node": "gpu-node-0001", "kind": "nvlink_down", "gpu": 2, "link": 0, "start": 95, "duration": 20},
        {"node": "gpu-node-0001", "kind": "power_capped", "gpu": 3, "start": 100, "duration": 40},
        # A deep cap over a power brake on one GPU: both lower its draw, which still never goes negative.
        {"node": "gpu-node-0001", "kind": "power_capped", "gpu": 0, "level": 0.2, "start": 85, "duration": 30},
    )])
    node = fleet.nodes["gpu-node-0001"]
    previous: dict[str, float] = {}
    try:
        for step in range(400):
            node.t = step * 0.5
            node.apply_faults()
            readings = {
                "energy0": node.workload.telemetry(node.boards[0], 0).energy_joules,
                "energy1": node.workload.telemetry(node.boards[1], 0).energy_joules,
                "energy3": node.workload.telemetry(node.boards[3], 0).energy_joules,
                "ib0_tx": node.sysfs_files.ib_bytes("mlx5_0/1", "tx"),
                "ib1_rx": node.sysfs_files.ib_bytes("mlx5_1/1", "rx"),
                "downed": node.sysfs_files.ib_link_downed("mlx5_1/1"),
            }
            for key, value in readings.items():
                assert value >= previous.get(key, 0), (key, node.t, value, previous.get(key))
            previous = readings
    finally:
        fleet.close()


def test_scenario_files_are_checked_with_clear_messages():
    fleet = make_fleet()
    ids = itertools.count(1)
    try:
        faults = load_scenario(
            "faults:\n"
            "  - {kind: xid, node: gpu-node-0002, gpu: 1, xid: 79, start: 2m}\n"
            "  - {kind: straggler, node: gpu-node-0001, start: 30s, duration: 5m}\n",
            fleet.nodes, 8, ids)
        assert [(f.kind, f.start, f.duration, f.xid) for f in faults] == [
            ("xid", 120.0, None, 79), ("straggler", 30.0, 300.0, None)]
        for text, message in (
            ("faults: [{kind: meltdown, node: gpu-node-0001}]", "fault 1: kind 'meltdown' is not one of"),
            ("faults: [{kind: xid, node: gpu-node-0001, xid: 79}]", "fault 1: kind xid needs 'gpu'"),
            ("faults: [{kind: xid, node: gpu-node-0099, gpu: 0, xid: 79}]", "node 'gpu-node-0099' is not in the fleet"),
            ("faults: [{kind: xid, node: gpu-node-0001, gpu: 8, xid: 79}]", "gpu must be a whole number from 0 to 7"),
            ("faults: [{kind: ib_link_down, node: gpu-node-0001, port: eth0}]", "needs an InfiniBand port"),
            ("faults: [{kind: straggler, node: gpu-node-0001, start: soon}]", "start: invalid duration 'soon'"),
            ("faults: [{kind: straggler, node: gpu-node-0001, colour: red}]", "unknown field 'colour'"),
            ("faults: [{kind: straggler, node: gpu-node-0001, direction: tx}]", "takes no direction"),
            ("faults: [{kind: straggler, node: gpu-node-0001, xid: 79}]", "kind straggler takes no xid"),
            ("faults: [{kind: kernel_events, node: gpu-node-0001, event: panic}]", "event must be one of soft_lockup"),
            ("faults: [{kind: straggler, node: gpu-node-0001, event: oom_kill}]", "kind straggler takes no event"),
            ("faults: [oops", "not valid YAML"),
            ("nodes: 3", "unknown top-level key 'nodes'"),
        ):
            with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
                load_scenario(text, fleet.nodes, 8, ids)
    finally:
        fleet.close()


def test_a_given_layout_is_run_as_written():
    layout = load_layout(
        "jobs:\n"
        "  - {id: '77', scheduler: slurm, nodes: [gpu-node-0003, gpu-node-0001], period: 1m}\n"
        "  - {id: 0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b, scheduler: kubernetes, nodes: [gpu-node-0004],"
        " memory_fraction: 0.5}\n", [f"gpu-node-{i:04d}" for i in range(1, 5)])
    fleet = Fleet(node_count=4, seed=1, layout=layout)
    try:
        assert [(j.id, j.nodes, j.period) for j in fleet.jobs] == [
            ("77", ("gpu-node-0001", "gpu-node-0003"), 60.0),
            ("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", ("gpu-node-0004",), 40.0)]
        assert {name: node.job and node.job.id for name, node in fleet.nodes.items()} == {
            "gpu-node-0001": "77", "gpu-node-0002": None, "gpu-node-0003": "77",
            "gpu-node-0004": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}
    finally:
        fleet.close()


@pytest.mark.parametrize(("text", "message"), [
    ("jobs: [{id: '1', scheduler: pbs, nodes: [gpu-node-0001]}]", "job 1: scheduler must be one of slurm"),
    ("jobs: [{id: abc, scheduler: slurm, nodes: [gpu-node-0001]}]", "a Slurm job id is a number"),
    ("jobs: [{id: '12', scheduler: kubernetes, nodes: [gpu-node-0001]}]", "a Kubernetes job id is a pod UID"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: [gpu-node-0099]}]", "node 'gpu-node-0099' is not in the fleet"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: [gpu-node-0001]}, {id: '2', scheduler: slurm,"
     " nodes: [gpu-node-0001]}]", "job 2: node gpu-node-0001 already runs job 1"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: [gpu-node-0001]}, {id: '1', scheduler: slurm,"
     " nodes: [gpu-node-0002]}]", "job id 1 is given twice"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: [gpu-node-0001], period: soon}]", "period: invalid duration 'soon'"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: [gpu-node-0001], comm_fraction: 1.5}]", "comm_fraction must be"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: []}]", "nodes must be a list of node names"),
    ("jobs: [{id: '1', scheduler: slurm, nodes: [gpu-node-0001], size: 3}]", "unknown field 'size'"),
    ("nodes: 3", "expected a mapping with a 'jobs' list"),
])
def test_layout_files_are_checked_with_clear_messages(text, message):
    with pytest.raises(LayoutError, match=message):
        load_layout(text, [f"gpu-node-{i:04d}" for i in range(1, 5)])


def test_a_fleet_layout_is_deterministic_and_mostly_busy():
    first, second = Fleet(node_count=40, seed=3), Fleet(node_count=40, seed=3)
    try:
        assert [(j.id, j.nodes) for j in first.jobs] == [(j.id, j.nodes) for j in second.jobs]
        busy = sum(len(j.nodes) for j in first.jobs)
        assert busy == 40 - 6  # 15 % idle.
        assert {j.scheduler for j in first.jobs} <= {"slurm", "kubernetes"}
    finally:
        first.close()
        second.close()


def test_clock_speed():
    from gpufleet.simulator.server import SimClock

    ticks = iter([10.0, 12.0])
    clock = SimClock(speed=30, monotonic=lambda: next(ticks))
    assert clock() == 60.0


def test_the_demo_scenario_loads():
    from pathlib import Path

    fleet = Fleet(node_count=16)
    try:
        text = (Path(__file__).parent.parent / "simulator" / "scenarios" / "demo.yml").read_text()
        faults = load_scenario(text, fleet.nodes, 8, itertools.count(1))
        assert len(faults) == 10 and {f.kind for f in faults} >= {"straggler", "gpu_lost", "exporter_down"}
    finally:
        fleet.close()
