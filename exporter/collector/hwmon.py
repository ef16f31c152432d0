"""Temperatures, fan speeds, voltages, currents, power and energy from hwmon chips under `<sysfs>/class/hwmon/`.

`hwmonN` numbers change between boots, so a chip is identified by the device it
belongs to (`coretemp.0`, `0000:00:18.3`, `nvme0`) and by its driver name; only
when a chip has no device does the hwmonN name stand in.

Drivers written before the hwmon class existed (and some still in use on server
boards) keep their sensor files in the device's directory, `hwmonN/device/`,
instead of in `hwmonN/`: both are read, and where a sensor file is in both the
class directory's copy wins, as node_exporter does.

A node's power meter (the ACPI `power_meter` of most server boards, or a PSU's
driver) is what the capacity report's node energy reads: it is the only figure
that includes the CPUs, fans and NICs beside the GPUs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.sysfs import SysfsReader

_LABELS = ("chip", "device", "sensor", "label")
_SENSOR_FILE = re.compile(r"^(temp|fan|in|curr|power|energy)(\d+)_([a-z_]+)$")


@dataclass(frozen=True)
class _Kind:
    """One kind of hwmon sensor, in the units of the kernel's sysfs-interface document."""

    quantity: str  # The metric's stem: gpufleet_hwmon_<quantity>[_<limit>]_<unit>.
    unit: str
    per: float  # The file's units in one of the metric's.
    readings: tuple[str, ...]  # The attributes that hold the reading, the first present wins.
    limits: tuple[str, ...]
    documentation: str
    counter: bool = False


_KINDS = {
    "temp": _Kind("temperature", "celsius", 1000.0, ("input",), ("max", "crit"),
                  "Temperature reported by a hwmon sensor."),
    "fan": _Kind("fan_speed", "rpm", 1.0, ("input",), (), "Fan speed reported by a hwmon sensor."),
    "in": _Kind("voltage", "volts", 1000.0, ("input",), ("min", "max", "lcrit", "crit"),
                "Voltage reported by a hwmon sensor."),
    "curr": _Kind("current", "amperes", 1000.0, ("input",), ("max", "crit"), "Current reported by a hwmon sensor."),
    # Power meters often give only an average over their own interval (power1_average), never an input.
    "power": _Kind("power", "watts", 1e6, ("input", "average"), ("cap", "max", "crit"),
                   "Power reported by a hwmon sensor: its instantaneous reading, else its average."),
    "energy": _Kind("energy", "joules", 1e6, ("input",), (), "Energy counted by a hwmon sensor.", counter=True),
}
_LIMITS = {"min": "lower warning limit", "max": "upper warning limit", "lcrit": "lower critical limit",
           "crit": "upper critical limit", "cap": "enforced cap"}


def _chip_device(sysfs: SysfsReader, hwmon: str) -> str:
    target = sysfs.readlink(f"class/hwmon/{hwmon}/device")
    return os.path.basename(target) if target else hwmon


class HwmonCollector(SysfsCollector):
    name = "hwmon"
    default_interval = 15.0

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        for hwmon in sysfs.listdir("class/hwmon"):
            self._collect_chip(sysfs, families, hwmon)

    def _collect_chip(self, sysfs: SysfsReader, families: FamilySet, hwmon: str) -> None:
        base = f"class/hwmon/{hwmon}"
        # Where each file is: the device's directory first, so that the class directory's copy wins.
        where = {name: f"{base}/device/{name}" for name in sysfs.listdir(f"{base}/device")}
        where.update({name: f"{base}/{name}" for name in sysfs.listdir(base)})
        chip = (sysfs.text(where["name"]) if "name" in where else None) or hwmon
        device = _chip_device(sysfs, hwmon)
        sensors: dict[tuple[str, int], set[str]] = {}
        for filename in where:
            if match := _SENSOR_FILE.match(filename):
                sensors.setdefault((match.group(1), int(match.group(2))), set()).add(match.group(3))
        for (prefix, number), attributes in sorted(sensors.items()):
            kind, sensor = _KINDS[prefix], f"{prefix}{number}"
            reading = next((a for a in kind.readings if a in attributes), None)
            value = sysfs.integer(where[f"{sensor}_{reading}"]) if reading else None
            if value is None:
                continue
            label = (sysfs.text(where[f"{sensor}_label"]) if "label" in attributes else None) or sensor
            labels = [chip, device, sensor, label]
            name = f"gpufleet_hwmon_{kind.quantity}_{kind.unit}"
            if kind.counter:
                families.counter(name, kind.documentation, _LABELS).add_metric(labels, value / kind.per)
            else:
                families.gauge(name, kind.documentation, _LABELS).add_metric(labels, value / kind.per)
            for limit in kind.limits:
                bound = sysfs.integer(where[f"{sensor}_{limit}"]) if limit in attributes else None
                if bound is not None:
                    families.gauge(
                        f"gpufleet_hwmon_{kind.quantity}_{limit}_{kind.unit}",
                        f"The {_LIMITS[limit]} of a hwmon {kind.quantity.replace('_', ' ')} sensor.",
                        _LABELS,
                    ).add_metric(labels, bound / kind.per)
