import re
import shutil
from pathlib import Path

from gpufleet.devtools.paths import FIXTURE_SYSFS, FIXTURES
from gpufleet.exporter.collector.infiniband import InfinibandCollector
from gpufleet.exporter.state import FileStore, PersistentState
from gpufleet.exporter.tree import DiskTree

from helpers import named, rendered, series

NDR = {"device": "mlx5_0", "port": "1"}
DOWN = {"device": "mlx5_1", "port": "1"}
ROCE = {"device": "mlx5_2", "port": "1"}


def collect(root=FIXTURE_SYSFS):
    collection = InfinibandCollector(DiskTree(root)).collect()
    return collection, rendered(collection)


def test_data_counters_are_words_converted_to_bytes_from_the_64_bit_files():
    collection, samples = collect()
    assert collection.problems == ()
    # counters_ext/port_xmit_data_64 = 123456789012345 words; counters/port_xmit_data is saturated at 2^32-1.
    assert samples[series("gpufleet_infiniband_port_xmit_data_bytes_total", **NDR)] == 123456789012345 * 4
    assert samples[series("gpufleet_infiniband_port_rcv_data_bytes_total", **NDR)] == 98765432109876 * 4
    assert samples[series("gpufleet_infiniband_port_xmit_packets_total", **NDR)] == 5000000000
    assert samples[series("gpufleet_infiniband_port_rcv_packets_total", **NDR)] == 4000000000
    assert samples[series("gpufleet_infiniband_unicast_xmit_packets_total", **NDR)] == 4999999000
    assert samples[series("gpufleet_infiniband_multicast_rcv_packets_total", **NDR)] == 1000


def test_the_32_bit_files_are_used_where_no_64_bit_ones_exist():
    _, samples = collect()
    assert samples[series("gpufleet_infiniband_port_xmit_data_bytes_total", **DOWN)] == 1234567 * 4
    assert samples[series("gpufleet_infiniband_port_rcv_data_bytes_total", **DOWN)] == 7654321 * 4
    assert samples[series("gpufleet_infiniband_port_xmit_packets_total", **DOWN)] == 1000


def test_no_counter_is_exported_twice_under_its_32_bit_and_64_bit_names():
    _, samples = collect()
    names = {name for name, labels in samples if dict(labels) == NDR}
    assert "gpufleet_infiniband_port_unicast_xmit_packets_total" not in names
    assert "gpufleet_infiniband_port_xmit_data_64_total" not in names


def test_error_and_congestion_counters():
    _, samples = collect()
    expected = {
        "gpufleet_infiniband_port_xmit_wait_total": 918273645,
        "gpufleet_infiniband_symbol_error_total": 7,
        "gpufleet_infiniband_link_downed_total": 1,
        "gpufleet_infiniband_link_error_recovery_total": 2,
        "gpufleet_infiniband_port_rcv_errors_total": 11,
        "gpufleet_infiniband_port_xmit_discards_total": 23,
        "gpufleet_infiniband_port_rcv_remote_physical_errors_total": 0,
        "gpufleet_infiniband_local_link_integrity_errors_total": 0,
        "gpufleet_infiniband_excessive_buffer_overrun_errors_total": 0,
        "gpufleet_infiniband_vl15_dropped_total": 0,
    }
    for name, value in expected.items():
        assert samples[series(name, **NDR)] == value, name
    assert samples[series("gpufleet_infiniband_link_downed_total", **DOWN)] == 5


def test_roce_hw_counters_are_exported_and_lifespan_is_not():
    _, samples = collect()
    expected = {
        "gpufleet_infiniband_hw_np_cnp_sent_total": 1200,
        "gpufleet_infiniband_hw_np_ecn_marked_roce_packets_total": 3400,
        "gpufleet_infiniband_hw_rp_cnp_handled_total": 1100,
        "gpufleet_infiniband_hw_rp_cnp_ignored_total": 0,
        "gpufleet_infiniband_hw_roce_slow_restart_total": 2,
        "gpufleet_infiniband_hw_out_of_buffer_total": 77,
        "gpufleet_infiniband_hw_local_ack_timeout_err_total": 4,
    }
    for name, value in expected.items():
        assert samples[series(name, **ROCE)] == value, name
    assert not any("lifespan" in name for name, _ in samples)


def test_rate_state_and_metadata():
    _, samples = collect()
    assert samples[series("gpufleet_infiniband_rate_bytes_per_second", **NDR)] == 400 * 125_000_000
    assert samples[series("gpufleet_infiniband_rate_bytes_per_second", **DOWN)] == 10 * 125_000_000
    assert samples[series("gpufleet_infiniband_rate_bytes_per_second", **ROCE)] == 100 * 125_000_000
    assert samples[series("gpufleet_infiniband_state_id", **NDR)] == 4
    assert samples[series("gpufleet_infiniband_state_id", **DOWN)] == 1
    assert samples[series("gpufleet_infiniband_physical_state_id", **NDR)] == 5
    assert samples[series("gpufleet_infiniband_physical_state_id", **DOWN)] == 3
    assert samples[series("gpufleet_infiniband_port_info", **ROCE, link_layer="Ethernet")] == 1
    assert samples[series("gpufleet_infiniband_info", device="mlx5_0", board_id="MT_0000000838",
                          firmware_version="28.39.1002", hca_type="MT4129", node_guid="946d:ae03:008a:1b2c")] == 1


def test_garbage_state_and_rate_are_reported(sysfs: Path):
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    (port / "rate").write_text("fast\n")
    (port / "state").write_text("ACTIVE\n")
    collection, samples = collect(sysfs)
    assert series("gpufleet_infiniband_rate_bytes_per_second", **NDR) not in samples
    assert series("gpufleet_infiniband_state_id", **NDR) not in samples
    assert samples[series("gpufleet_infiniband_state_id", **DOWN)] == 1
    assert collection.problems == (
        "class/infiniband/mlx5_0/ports/1/rate: unrecognised rate 'fast'",
        "class/infiniband/mlx5_0/ports/1/state: unrecognised state 'ACTIVE'",
    )


def test_a_hot_unplugged_hca_disappears_without_error(sysfs: Path):
    shutil.rmtree(sysfs / "class/infiniband/mlx5_1")
    collection, samples = collect(sysfs)
    assert collection.problems == ()
    assert {dict(l)["device"] for l in named(samples, "gpufleet_infiniband_state_id")} == {"mlx5_0", "mlx5_2"}


def known(collector) -> tuple[dict, dict]:
    """Each port's seen-active flag and known rate after one collection, by device."""
    samples = rendered(collector.collect())
    return ({dict(l)["device"]: v for l, v in named(samples, "gpufleet_infiniband_port_seen_active").items()},
            {dict(l)["device"]: v for l, v in
             named(samples, "gpufleet_infiniband_rate_capability_bytes_per_second").items()})


def test_a_port_never_seen_active_is_told_from_one_that_died_across_restarts_and_reboots(sysfs: Path, tmp_path):
    state = tmp_path / "state"
    state.mkdir()

    def exporter() -> InfinibandCollector:  # A new process, reading what the last one kept.
        return InfinibandCollector(DiskTree(sysfs), state=PersistentState(FileStore(state)))

    seen, rates = known(exporter())
    assert seen == {"mlx5_0": 1, "mlx5_1": 0, "mlx5_2": 1}  # mlx5_1 has been DOWN since the exporter began.
    assert rates == {"mlx5_0": 400 * 125_000_000, "mlx5_2": 100 * 125_000_000}  # Each of its own model.
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "rate").write_text("10 Gb/sec (4X SDR)\n")
    seen, rates = known(exporter())  # Restarted (or rebooted) with the port dead.
    assert seen["mlx5_0"] == 1 and rates["mlx5_0"] == 400 * 125_000_000
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (2X NDR)\n")  # Back, trained down to half its lanes.
    _, rates = known(exporter())
    assert rates["mlx5_0"] == 400 * 125_000_000


def test_a_port_that_came_up_slow_is_judged_against_its_same_model_peers(sysfs: Path):
    shutil.copytree(sysfs / "class/infiniband/mlx5_0", sysfs / "class/infiniband/mlx5_3", symlinks=True)
    (sysfs / "class/infiniband/mlx5_3/node_guid").write_text("946d:ae03:008a:1b2d\n")
    (sysfs / "class/infiniband/mlx5_3/ports/1/rate").write_text("200 Gb/sec (2X NDR)\n")
    _, rates = known(InfinibandCollector(DiskTree(sysfs)))
    assert rates["mlx5_3"] == rates["mlx5_0"] == 400 * 125_000_000
    assert rates["mlx5_2"] == 100 * 125_000_000  # Another model: not compared with the NDR HCAs.


def test_hcas_can_be_left_out_by_name(sysfs: Path):
    def devices(**flags) -> set[str]:
        samples = rendered(InfinibandCollector(DiskTree(sysfs), **flags).collect())
        return {dict(l)["device"] for l in named(samples, "gpufleet_infiniband_state_id")}

    assert devices(exclude=re.compile("^mlx5_1$")) == {"mlx5_0", "mlx5_2"}
    assert devices(include=re.compile("^mlx5_[01]$")) == {"mlx5_0", "mlx5_1"}
    assert devices(include=re.compile("mlx5"), exclude=re.compile("_2$")) == {"mlx5_0", "mlx5_1"}


def test_a_narrow_error_counter_at_its_maximum_is_exported_as_stopped():
    """symbol_error at 65535 (16 bits), link_downed at 255 (8 bits) and local_link_integrity_errors at 15 (4 bits)
    count nothing more; the counters below their maximum, and the 32-bit data counter the kernel reads with no
    twin here, are not called stopped."""
    for beside in (False, True):  # Beside node_exporter, which exports the counters, the signal is still gpufleet's.
        collector = InfinibandCollector(DiskTree(FIXTURES / "sys-saturated"), beside_node_exporter=beside)
        samples = rendered(collector.collect())
        assert named(samples, "gpufleet_infiniband_port_counter_saturated") == {
            frozenset({("device", "mlx5_0"), ("port", "1"), ("counter", name)}): 1.0
            for name in ("symbol_error", "link_downed", "local_link_integrity_errors")}
        assert (series("gpufleet_infiniband_symbol_error_total", **NDR) in samples) is not beside
