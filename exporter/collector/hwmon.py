"""Temperatures and fan speeds from hwmon chips under `<sysfs>/class/hwmon/`.

`hwmonN` numbers change between boots, so a chip is identified by the device it
belongs to (`coretemp.0`, `0000:00:18.3`, `nvme0`) and by its driver name; only
when a chip has no device does the hwmonN name stand in.
"""

from __future__ import annotations

import os
import re

from gpufleet.exporter.collector import FamilySet, SysfsCollector
from gpufleet.exporter.sysfs import SysfsReader

_LABELS = ("chip", "device", "sensor", "label")
_TEMP_INPUT = re.compile(r"^temp(\d+)_input$")
_FAN_INPUT = re.compile(r"^fan(\d+)_input$")
_MILLI = 1000.0
_TEMP_LIMITS = (
    ("max", "gpufleet_hwmon_temperature_max_celsius", "Temperature at which the chip raises its max alarm."),
    ("crit", "gpufleet_hwmon_temperature_crit_celsius", "Temperature at which the chip raises its critical alarm."),
)


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
        chip = sysfs.text(f"{base}/name") or hwmon
        device = _chip_device(sysfs, hwmon)
        for filename in sysfs.listdir(f"class/hwmon/{hwmon}"):
            if match := _TEMP_INPUT.match(filename):
                sensor = f"temp{match.group(1)}"
                value = sysfs.integer(f"{base}/{filename}")
                if value is None:
                    continue
                labels = [chip, device, sensor, sysfs.text(f"{base}/{sensor}_label") or sensor]
                families.gauge(
                    "gpufleet_hwmon_temperature_celsius", "Temperature reported by a hwmon sensor.", _LABELS
                ).add_metric(labels, value / _MILLI)
                for suffix, metric, documentation in _TEMP_LIMITS:
                    limit = sysfs.integer(f"{base}/{sensor}_{suffix}")
                    if limit is not None:
                        families.gauge(metric, documentation, _LABELS).add_metric(labels, limit / _MILLI)
            elif match := _FAN_INPUT.match(filename):
                sensor = f"fan{match.group(1)}"
                value = sysfs.integer(f"{base}/{filename}")
                if value is not None:
                    families.gauge(
                        "gpufleet_hwmon_fan_speed_rpm", "Fan speed reported by a hwmon sensor.", _LABELS
                    ).add_metric([chip, device, sensor, sysfs.text(f"{base}/{sensor}_label") or sensor], value)
