"""The hwmon and thermal_zone collectors on the fixture tree of a dual-socket Intel, an AMD and an NVMe drive."""

from pathlib import Path

from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector.hwmon import HwmonCollector
from gpufleet.exporter.collector.thermal_zone import ThermalZoneCollector
from gpufleet.exporter.tree import DiskTree

from helpers import named, rendered, series


def hwmon(root=FIXTURE_SYSFS):
    collection = HwmonCollector(DiskTree(root)).collect()
    return collection, rendered(collection)


def test_hwmon_temperatures_with_labels_and_limits():
    collection, samples = hwmon()
    assert collection.problems == ()
    package0 = {"chip": "coretemp", "device": "coretemp.0", "sensor": "temp1", "label": "Package id 0"}
    assert samples[series("gpufleet_hwmon_temperature_celsius", **package0)] == 45.0
    assert samples[series("gpufleet_hwmon_temperature_max_celsius", **package0)] == 84.0
    assert samples[series("gpufleet_hwmon_temperature_crit_celsius", **package0)] == 100.0
    assert samples[series("gpufleet_hwmon_temperature_celsius", chip="coretemp", device="coretemp.1",
                          sensor="temp1", label="Package id 1")] == 47.0
    assert samples[series("gpufleet_hwmon_temperature_celsius", chip="k10temp", device="0000:00:18.3",
                          sensor="temp1", label="Tctl")] == 52.375
    assert samples[series("gpufleet_hwmon_temperature_celsius", chip="k10temp", device="0000:00:18.3",
                          sensor="temp3", label="Tccd1")] == 49.25
    assert samples[series("gpufleet_hwmon_temperature_celsius", chip="nvme", device="nvme0",
                          sensor="temp1", label="Composite")] == 38.85


def test_two_chips_with_the_same_driver_stay_apart():
    _, samples = hwmon()
    coretemps = {dict(l)["device"] for l in named(samples, "gpufleet_hwmon_temperature_celsius")
                 if dict(l)["chip"] == "coretemp"}
    assert coretemps == {"coretemp.0", "coretemp.1"}


def test_sensors_without_label_or_device_fall_back_to_their_own_names():
    _, samples = hwmon()
    assert samples[series("gpufleet_hwmon_temperature_celsius", chip="nct6798", device="hwmon4",
                          sensor="temp1", label="temp1")] == 36.0
    assert samples[series("gpufleet_hwmon_fan_speed_rpm", chip="nct6798", device="hwmon4",
                          sensor="fan1", label="fan1")] == 1200
    assert samples[series("gpufleet_hwmon_fan_speed_rpm", chip="nct6798", device="hwmon4",
                          sensor="fan2", label="CPU_FAN")] == 0
    # Limits exist only where the chip has them.
    assert len(named(samples, "gpufleet_hwmon_temperature_max_celsius")) == 4


def test_hwmon_garbage_is_reported(sysfs: Path):
    (sysfs / "class/hwmon/hwmon2/temp1_input").write_text("\x00\xff")
    collection, samples = hwmon(sysfs)
    assert collection.problems == ("class/hwmon/hwmon2/temp1_input: not ASCII text",)
    assert len(named(samples, "gpufleet_hwmon_temperature_celsius")) == 8


def test_node_power_voltage_and_current_in_base_units_with_their_limits():
    collection, samples = hwmon()
    assert collection.problems == ()
    meter = {"chip": "power_meter", "device": "ACPI000D:00", "sensor": "power1", "label": "power1"}
    assert samples[series("gpufleet_hwmon_power_watts", **meter)] == 1843.0  # Only an average: it stands in.
    assert samples[series("gpufleet_hwmon_power_cap_watts", **meter)] == 10200.0
    psu = {"chip": "pmbus", "device": "7-0058"}
    assert samples[series("gpufleet_hwmon_power_watts", **psu, sensor="power1", label="pin")] == 1846.0
    assert samples[series("gpufleet_hwmon_power_max_watts", **psu, sensor="power1", label="pin")] == 3000.0
    assert samples[series("gpufleet_hwmon_power_watts", **psu, sensor="power2", label="pout")] == 1752.0
    vin = {**psu, "sensor": "in1", "label": "vin"}
    assert samples[series("gpufleet_hwmon_voltage_volts", **vin)] == 230.125
    assert samples[series("gpufleet_hwmon_voltage_lcrit_volts", **vin)] == 180.0
    assert samples[series("gpufleet_hwmon_voltage_crit_volts", **vin)] == 264.0
    iin = {**psu, "sensor": "curr1", "label": "iin"}
    assert samples[series("gpufleet_hwmon_current_amperes", **iin)] == 8.03
    assert samples[series("gpufleet_hwmon_current_max_amperes", **iin)] == 14.0
    assert samples[series("gpufleet_hwmon_energy_joules_total", chip="amd_energy", device="amd_energy.0",
                          sensor="energy1", label="Esocket0")] == 9876.54321
    # Attributes that are neither a reading nor a limit (an averaging interval, a model number) are not series.
    assert len(named(samples, "gpufleet_hwmon_power_watts")) == 3


def test_an_older_driver_is_read_from_the_device_directory():
    _, samples = hwmon()
    it87 = {"chip": "it8728", "device": "it87.656"}  # Its name, too, is in the device's directory.
    assert samples[series("gpufleet_hwmon_voltage_volts", **it87, sensor="in0", label="in0")] == 1.008
    assert samples[series("gpufleet_hwmon_voltage_max_volts", **it87, sensor="in0", label="in0")] == 3.06
    assert samples[series("gpufleet_hwmon_fan_speed_rpm", **it87, sensor="fan1", label="fan1")] == 2100
    assert samples[series("gpufleet_hwmon_temperature_celsius", **it87, sensor="temp1", label="temp1")] == 33.0


def test_the_class_directory_wins_over_the_device_directory(sysfs: Path):
    (sysfs / "class/hwmon/hwmon7/in0_input").write_text("1500\n")  # Both have in0_input.
    collection, samples = hwmon(sysfs)
    assert collection.problems == ()
    assert samples[series("gpufleet_hwmon_voltage_volts", chip="it8728", device="it87.656",
                          sensor="in0", label="in0")] == 1.5


def test_thermal_zones_and_trip_points():
    collection = ThermalZoneCollector(DiskTree(FIXTURE_SYSFS)).collect()
    samples = rendered(collection)
    assert collection.problems == ()
    assert named(samples, "gpufleet_thermal_zone_temperature_celsius") == {
        frozenset({("zone", "thermal_zone0"), ("type", "x86_pkg_temp")}): 46.0,
        frozenset({("zone", "thermal_zone1"), ("type", "acpitz")}): 27.8,
    }
    assert samples[series("gpufleet_thermal_zone_trip_point_celsius", zone="thermal_zone1", type="acpitz",
                          trip_point="0", trip_type="critical")] == 105.0
