import re
from pathlib import Path

from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector.network import NetworkCollector
from gpufleet.exporter.tree import DiskTree

from helpers import named, rendered, series


def collect(root=FIXTURE_SYSFS, **kwargs):
    collection = NetworkCollector(DiskTree(root), **kwargs).collect()
    return collection, rendered(collection)


def test_values_match_the_fixture_files_exactly():
    collection, samples = collect()
    assert collection.problems == ()
    assert samples[series("gpufleet_network_receive_bytes_total", device="eno1")] == 9876543210123
    assert samples[series("gpufleet_network_transmit_bytes_total", device="eno1")] == 1234567890123
    assert samples[series("gpufleet_network_receive_packets_total", device="eno1")] == 7123456789
    assert samples[series("gpufleet_network_transmit_packets_total", device="eno1")] == 1987654321
    assert samples[series("gpufleet_network_receive_errors_total", device="eno1")] == 3
    assert samples[series("gpufleet_network_receive_dropped_total", device="eno1")] == 1542
    assert samples[series("gpufleet_network_receive_missed_errors_total", device="eno1")] == 17
    assert samples[series("gpufleet_network_multicast_total", device="eno1")] == 42311
    assert samples[series("gpufleet_network_receive_dropped_total", device="ib0")] == 12
    # 25000 Mb/s and 400000 Mb/s in bytes per second.
    assert samples[series("gpufleet_network_speed_bytes_per_second", device="eno1")] == 3_125_000_000
    assert samples[series("gpufleet_network_speed_bytes_per_second", device="ib0")] == 50_000_000_000
    assert samples[series("gpufleet_network_carrier_changes_total", device="eno1")] == 4
    assert samples[series("gpufleet_network_mtu_bytes", device="eno1")] == 9000
    assert samples[series("gpufleet_network_up", device="eno1")] == 1
    assert samples[series("gpufleet_network_up", device="eno2")] == 0
    assert samples[series("gpufleet_network_info", device="eno1", address="b4:96:91:a1:22:30",
                          operstate="up", duplex="full")] == 1


def test_a_link_that_is_down_reports_no_speed_rather_than_a_negative_one():
    _, samples = collect()
    speeds = named(samples, "gpufleet_network_speed_bytes_per_second")
    assert frozenset({("device", "eno2")}) not in speeds
    assert all(value > 0 for value in speeds.values())


def test_virtual_devices_are_left_out_by_default():
    _, samples = collect()
    devices = {dict(labels)["device"] for labels in named(samples, "gpufleet_network_up")}
    assert devices == {"eno1", "eno2", "ib0"}


def test_include_and_exclude_expressions():
    _, samples = collect(include=re.compile("^eno"), exclude=None)
    assert {dict(l)["device"] for l in named(samples, "gpufleet_network_up")} == {"eno1", "eno2"}
    _, samples = collect(include=None, exclude=None)
    assert {dict(l)["device"] for l in named(samples, "gpufleet_network_up")} == {
        "eno1", "eno2", "ib0", "lo", "docker0", "veth3c9a1f2"}


def test_garbage_in_a_counter_file_drops_that_series_and_reports_it(sysfs: Path):
    (sysfs / "class/net/eno1/statistics/rx_bytes").write_text("not-a-number\n")
    collection, samples = collect(sysfs)
    assert series("gpufleet_network_receive_bytes_total", device="eno1") not in samples
    assert samples[series("gpufleet_network_transmit_bytes_total", device="eno1")] == 1234567890123
    assert collection.problems == ("class/net/eno1/statistics/rx_bytes: not an integer: 'not-a-number'",)


def test_an_unreadable_file_is_reported_without_the_host_path(sysfs: Path):
    target = sysfs / "class/net/eno1/statistics/tx_bytes"
    target.unlink()
    target.mkdir()  # Reading a directory fails with EISDIR, as an unreadable attribute would.
    collection, samples = collect(sysfs)
    assert series("gpufleet_network_transmit_bytes_total", device="eno1") not in samples
    assert len(collection.problems) == 1
    assert collection.problems[0].startswith("class/net/eno1/statistics/tx_bytes: cannot read")
    assert str(sysfs) not in collection.problems[0]


def test_a_vanished_interface_simply_disappears(sysfs: Path):
    import shutil

    shutil.rmtree(sysfs / "class/net/eno2")
    collection, samples = collect(sysfs)
    assert collection.problems == ()
    assert {dict(l)["device"] for l in named(samples, "gpufleet_network_up")} == {"eno1", "ib0"}


def test_a_missing_class_directory_yields_nothing_and_no_error(tmp_path: Path):
    collection, samples = collect(tmp_path)
    assert collection.problems == ()
    assert samples == {}
