"""ACPI and SoC thermal zones from `<sysfs>/class/thermal/thermal_zone*/`.

Thermal zones are what the kernel itself throttles on, so their trip points are
exported beside the temperature: a dashboard can then show the headroom the
kernel sees rather than a fixed threshold someone guessed.
"""

from __future__ import annotations

import re

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.sysfs import SysfsReader

_ZONE = re.compile(r"^thermal_zone\d+$")
_TRIP_TEMP = re.compile(r"^trip_point_(\d+)_temp$")
_MILLI = 1000.0


class ThermalZoneCollector(SysfsCollector):
    name = "thermal_zone"
    default_interval = 15.0

    def read(self, sysfs: SysfsReader, families: FamilySet) -> None:
        for zone in sysfs.listdir("class/thermal"):
            if not _ZONE.match(zone):
                continue
            base = f"class/thermal/{zone}"
            zone_type = sysfs.text(f"{base}/type") or ""
            temperature = sysfs.integer(f"{base}/temp")
            if temperature is not None:
                families.gauge(
                    "gpufleet_thermal_zone_temperature_celsius", "Thermal zone temperature.", ("zone", "type")
                ).add_metric([zone, zone_type], temperature / _MILLI)
            for filename in sysfs.listdir(f"class/thermal/{zone}"):
                match = _TRIP_TEMP.match(filename)
                if not match:
                    continue
                trip_temperature = sysfs.integer(f"{base}/{filename}")
                if trip_temperature is None:
                    continue
                trip_type = sysfs.text(f"{base}/trip_point_{match.group(1)}_type") or ""
                families.gauge(
                    "gpufleet_thermal_zone_trip_point_celsius",
                    "Temperature of a thermal zone trip point (passive, active, hot, critical).",
                    ("zone", "type", "trip_point", "trip_type"),
                ).add_metric([zone, zone_type, match.group(1), trip_type], trip_temperature / _MILLI)
