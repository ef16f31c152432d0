"""gpufleet's node-level series and node_exporter's names for the same readings, for a site that keeps node_exporter.

With `node_exporter_job` set in the configuration, the rules, dashboards and reports read node_exporter's series
(`Config.metric` renames through `NAMES`) and the exporter runs without its `network`, `hwmon` and
`thermal_zone` collectors, its `infiniband` collector reduced to what node_exporter lacks
(`--collector.infiniband.beside-node-exporter`). The names are node_exporter 1.5's (Debian 12), whose
`netdev`, `netclass`, `infiniband`, `hwmon` and `thermal_zone` collectors read the same sysfs and procfs files;
the labels that rules join on (`device`, `port`, `sensor`) carry the same values. Three differ: a hwmon `chip` is
named from its device path rather than its driver's name (`node_hwmon_chip_names` maps one to the other), a
thermal `zone` is its number (`0`, not `thermal_zone0`), and a network counter comes from /proc/net/dev rather
than sysfs statistics.
"""

from __future__ import annotations

_IB = "infiniband"
_NET = "network"
_HWMON = "hwmon"

# gpufleet's name -> node_exporter's, by collector. A reading node_exporter has and gpufleet does not, or the
# reverse, is not here: docs/exporter/node-exporter.md lists both.
RENAMED: dict[str, dict[str, str]] = {
    _IB: {
        "info": "info",
        "state_id": "state_id",
        "physical_state_id": "physical_state_id",
        "rate_bytes_per_second": "rate_bytes_per_second",
        "port_xmit_data_bytes_total": "port_data_transmitted_bytes_total",
        "port_rcv_data_bytes_total": "port_data_received_bytes_total",
        "port_xmit_packets_total": "port_packets_transmitted_total",
        "port_rcv_packets_total": "port_packets_received_total",
        "unicast_xmit_packets_total": "unicast_packets_transmitted_total",
        "unicast_rcv_packets_total": "unicast_packets_received_total",
        "multicast_xmit_packets_total": "multicast_packets_transmitted_total",
        "multicast_rcv_packets_total": "multicast_packets_received_total",
        "port_xmit_wait_total": "port_transmit_wait_total",
        "port_xmit_discards_total": "port_discards_transmitted_total",
        "port_rcv_errors_total": "port_errors_received_total",
        "port_rcv_remote_physical_errors_total": "port_receive_remote_physical_errors_total",
        "port_rcv_switch_relay_errors_total": "port_receive_switch_relay_errors_total",
        "port_rcv_constraint_errors_total": "port_constraint_errors_received_total",
        "port_xmit_constraint_errors_total": "port_constraint_errors_transmitted_total",
        "link_downed_total": "link_downed_total",
        "link_error_recovery_total": "link_error_recovery_total",
        "symbol_error_total": "symbol_error_total",
        "local_link_integrity_errors_total": "local_link_integrity_errors_total",
        "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors_total",
        "vl15_dropped_total": "vl15_dropped_total",
    },
    _NET: {
        "info": "info",
        "up": "up",
        "mtu_bytes": "mtu_bytes",
        "speed_bytes_per_second": "speed_bytes",
        "carrier_changes_total": "carrier_changes_total",
        "receive_bytes_total": "receive_bytes_total",
        "transmit_bytes_total": "transmit_bytes_total",
        "receive_packets_total": "receive_packets_total",
        "transmit_packets_total": "transmit_packets_total",
        "receive_errors_total": "receive_errs_total",
        "transmit_errors_total": "transmit_errs_total",
        "receive_dropped_total": "receive_drop_total",
        "transmit_dropped_total": "transmit_drop_total",
        "receive_fifo_errors_total": "receive_fifo_total",
        "transmit_fifo_errors_total": "transmit_fifo_total",
        "receive_frame_errors_total": "receive_frame_total",
        "receive_compressed_total": "receive_compressed_total",
        "transmit_compressed_total": "transmit_compressed_total",
        "multicast_total": "receive_multicast_total",
        "collisions_total": "transmit_colls_total",
        "transmit_carrier_errors_total": "transmit_carrier_total",
    },
    _HWMON: {
        "temperature_celsius": "temp_celsius",
        "temperature_max_celsius": "temp_max_celsius",
        "temperature_crit_celsius": "temp_crit_celsius",
        "power_watts": "power_watt",
        "power_max_watts": "power_max_watt",
        "power_cap_watts": "power_cap_watt",
        "fan_speed_rpm": "fan_rpm",
        "voltage_volts": "in_volts",
        "voltage_max_volts": "in_max_volts",
        "voltage_crit_volts": "in_crit_volts",
        "voltage_lcrit_volts": "in_lcrit_volts",
        "current_amperes": "curr_amps",
        "current_max_amperes": "curr_max_amps",
        "energy_joules_total": "energy_joule_total",
    },
    "thermal_zone": {"temperature_celsius": "temp"},
}
NAMES = {f"gpufleet_{collector}_{ours}": f"node_{collector}_{theirs}"
         for collector, names in RENAMED.items() for ours, theirs in names.items()}
# What gpufleet's infiniband collector still exports beside node_exporter, which has nothing like it.
KEPT = {
    "gpufleet_infiniband_hw_*_total": "the HCA's `hw_counters/` (RoCE retransmissions, out-of-buffer drops, ECN)",
    "gpufleet_infiniband_port_seen_active": "whether the port has ever been ACTIVE, kept across restarts: a port "
                                            "never cabled does not page",
    "gpufleet_infiniband_rate_capability_bytes_per_second": "the rate the port is known to reach, against which a "
                                                            "link trained down is judged",
    "gpufleet_infiniband_port_info": "the port's link layer (InfiniBand or Ethernet, for RoCE)",
}
# What the exporter runs without beside node_exporter; `infiniband` stays, reduced by the flag below.
COLLECTORS_OFF = (_NET, _HWMON, "thermal_zone")
EXPORTER_FLAGS = (*(f"--no-collector.{name}" for name in COLLECTORS_OFF), "--collector.infiniband.beside-node-exporter")
# node_exporter's collectors that read the same files, and the flag that makes `netdev` read /proc/net/dev (as
# gpufleet reads files) rather than ask the kernel by netlink.
NODE_EXPORTER_COLLECTORS = ("netdev", "netclass", "infiniband", "hwmon", "thermal_zone")
NODE_EXPORTER_FLAGS = ("--no-collector.netdev.netlink",)
# The chip a node's own power meter shows as (Linux's acpi_power_meter driver), by its driver's name.
POWER_METER_CHIP = "power_meter"
