"""The node's BMC, as Prometheus' ipmi_exporter reads it: power supplies, fans and the inlet's air, which the BMC
sees before the GPUs do.

The rules read ipmi_exporter's own series (its `ipmi` collector's, from FreeIPMI's `ipmimonitoring`), judged by the
BMC's own thresholds: the `*_state` series are 0 (nominal), 1 (warning) or 2 (critical), as the BMC classes each
reading. A power supply is a discrete sensor (`ipmi_sensor_state{type="Power Supply"}`); a fan and a temperature
have typed series (`ipmi_fan_speed_state`, `ipmi_temperature_state`) with the sensor's `name`. Each alert carries
the node's `instance` as the exporters' targets name it (the scrape job relabels ipmi_exporter's targets so), so that
it joins the node's incident at Alertmanager, and the node's pages (down, unreachable) hold its warnings back.
A BMC whose sensors cannot be read tickets, so that a blind BMC does not pass for a healthy one."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import TREND_INTERVAL, alert

CRITICAL = 2  # ipmi_exporter's state for a reading the BMC classes critical.


def bmc(c: Config) -> list[dict[str, Any]]:
    """The BMC group, where the site scrapes ipmi_exporter (`Config.ipmi_exporter_job`)."""
    if not c.ipmi_exporter_job:
        return []
    job = f'job="{c.ipmi_exporter_job}"'
    node = c.node()
    power = f'ipmi_sensor_state{{{job},type=~"Power Supply|Power Unit"}} == {CRITICAL}'
    fans = f"ipmi_fan_speed_state{{{job}}} == {CRITICAL}"
    inlet = f'ipmi_temperature_state{{{job},name=~"{c.inlet_sensor}"}} == {CRITICAL}'
    celsius = f'ipmi_temperature_celsius{{{job},{c.cluster_label}="%s",instance="%s",name="%s"}}'
    blind = f'max by ({node}) (ipmi_up{{{job},collector="ipmi"}} == 0 or up{{{job}}} == 0)'
    rules = [
        alert(c, "NodePowerSupplyFailed", power, "warning", "A power supply of a node has failed.",
              "The BMC of {{ $labels.instance }} reports {{ $labels.name }} critical: the node runs on its other "
              "supplies, without redundancy; one more failure, or a feed lost, powers it off.",
              for_="5m", held=False),
        alert(c, "NodeFanFailed", fans, "warning", "A fan of a node has stopped or is failing.",
              "The BMC of {{ $labels.instance }} reports fan {{ $labels.name }} below its critical threshold: its "
              "GPUs and CPUs lose cooling, and the others run harder.", for_="5m", held=False),
        alert(c, "NodeInletTemperatureHigh", inlet, "critical", "A node takes in air above its critical limit.",
              f"{{{{ with printf `{celsius}` $labels.{c.cluster_label} $labels.instance $labels.name | query }}}}"
              "{{ . | first | value | printf `%.0f` }} °C{{ else }}The temperature{{ end }} at {{ $labels.name }} of "
              "{{ $labels.instance }} is above the BMC's critical limit: the room's or the rack's cooling, not the "
              "node. Its GPUs slow down for heat, and the BMC may power it off.", for_="5m", held=False,
              at_stake=True),
        alert(c, "NodeBmcUnreadable", f"{blind} and on ({c.by('instance')}) {c.up()} == 1", "warning",
              "A node's BMC sensors cannot be read.",
              "ipmi_exporter on {{ $labels.instance }} cannot read the BMC's sensors, or cannot be scraped, while "
              "the node is up: its power supplies, fans and inlet temperature go unwatched.", for_="30m",
              held=False),
    ]
    return [{"name": "gpufleet-bmc", "interval": c.d(TREND_INTERVAL), "rules": rules}]
