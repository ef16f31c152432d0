"""Node detail: one node's GPUs, links, sensors and jobs, for the engineer who was sent here by an alert."""

from gpufleet.dashboards.panels import GPU, NODE, PORT_LEGEND, dashboard, rate, stat, table, timeseries

_BY_GPU = "{{instance}} GPU {{gpu}}"


dashboard = dashboard(
    "gpufleet-node", "gpufleet / Node detail",
    "Per GPU utilisation, memory, power, temperatures, clocks and errors; the node's NICs, sensors and jobs.",
    ["cluster", "instance", "gpu"],
    [
        [stat("GPUs up", f"sum(gpufleet_gpu_up{{{NODE}}})"),
         stat("GPUs NVML lists", f"sum(gpufleet_gpu_devices{{{NODE}}})",
              description="Fewer than the PCI devices means a GPU fell off the bus before the exporter started."),
         stat("NVIDIA PCI devices", f"sum(gpufleet_gpu_pci_devices{{{NODE}}})"),
         stat("GPU utilisation", f"avg(gpufleet_gpu_utilization_ratio{{{GPU}}})", "percentunit"),
         stat("Power", f"sum(gpufleet_gpu_power_watts{{{GPU}}})", "watt"),
         stat("Firing alerts", f'count(ALERTS{{alertstate="firing", {NODE}}}) or vector(0)',
              thresholds=(("green", None), ("orange", 1)))],
        [timeseries("GPU utilisation", [(f"gpufleet_gpu_utilization_ratio{{{GPU}}}", _BY_GPU)], "percentunit",
                    max_value=1),
         timeseries("GPU memory used", [
             (f"gpufleet_gpu_memory_used_bytes{{{GPU}}} / gpufleet_gpu_memory_total_bytes{{{GPU}}}", _BY_GPU)],
             "percentunit", max_value=1)],
        [timeseries("Power against limit", [
            (f"gpufleet_gpu_power_watts{{{GPU}}} / gpufleet_gpu_power_limit_watts{{{GPU}}}", _BY_GPU)],
            "percentunit", description="Board power as a share of the enforced power limit."),
         timeseries("Temperature", [
             (f"gpufleet_gpu_temperature_celsius{{{GPU}}}", _BY_GPU + " core"),
             (f"gpufleet_gpu_memory_temperature_celsius{{{GPU}}}", _BY_GPU + " memory"),
         ], "celsius")],
        [timeseries("Thermal margin", [(f"gpufleet_gpu_thermal_margin_celsius{{{GPU}}}", _BY_GPU)], "celsius",
                    width=8, description="Degrees below the slowdown temperature; near 0 the GPU throttles."),
         timeseries("SM clock", [(f'gpufleet_gpu_clock_hertz{{{GPU}, clock="sm"}}', _BY_GPU)], "hertz", width=8),
         timeseries("Memory clock", [(f'gpufleet_gpu_clock_hertz{{{GPU}, clock="memory"}}', _BY_GPU)], "hertz",
                    width=8)],
        [timeseries("Active clock-event reasons", [
            (f'sum by (reason) (gpufleet_gpu_clock_event_active{{{GPU}, reason!="gpu_idle"}})', "{{reason}}")],
            "short", stacked=True, description="GPUs whose clocks are held down, per reason."),
         timeseries("XIDs", [(f"sum by (instance, gpu, xid) (increase(gpufleet_gpu_xid_errors_total{{{GPU}}}"
                              "[$__rate_interval]))", _BY_GPU + " XID {{xid}}")], "short")],
        [timeseries("ECC errors", [(f"sum by (instance, gpu, error) (increase(gpufleet_gpu_ecc_errors_total"
                                    f'{{{GPU}, scope="volatile"}}[$__rate_interval]))', _BY_GPU + " {{error}}")],
                    "short", width=8),
         timeseries("Remapped rows", [(f"gpufleet_gpu_remapped_rows{{{GPU}}}", _BY_GPU + " {{cause}}")], "short",
                    width=8),
         timeseries("PCIe replays", [(rate("gpufleet_gpu_pcie_replays_total", GPU), _BY_GPU)], "ops", width=8)],
        [timeseries("NVLink throughput", [
            (f"sum by (instance, gpu) ({rate('gpufleet_gpu_nvlink_transmit_bytes_total', GPU)})", _BY_GPU + " tx"),
            (f"sum by (instance, gpu) ({rate('gpufleet_gpu_nvlink_receive_bytes_total', GPU)})", _BY_GPU + " rx"),
        ], "Bps", width=8),
         timeseries("NVLink errors", [
             (f"sum by (instance, gpu, error) ({rate('gpufleet_gpu_nvlink_errors_total', GPU)})",
              _BY_GPU + " {{error}}")], "ops", width=8),
         timeseries("NVLinks up", [(f"sum by (instance, gpu) (gpufleet_gpu_nvlink_up{{{GPU}}})", _BY_GPU)], "short",
                    width=8, description="A step down is a link lost; its traffic moves to the others or stops.")],
        [table("PCIe links", [
            (f"gpufleet_gpu_pcie_link_width{{{GPU}}}", "width"),
            (f"gpufleet_gpu_pcie_link_max_width{{{GPU}}}", "max width"),
            (f"gpufleet_gpu_pcie_link_generation{{{GPU}}}", "generation"),
            (f"gpufleet_gpu_pcie_link_max_generation{{{GPU}}}", "max generation"),
        ], width=12, description="A link narrower or slower than its maximum starves the GPU of host bandwidth."),
         table("GPUs", [(f"gpufleet_gpu_info{{{GPU}}}", "")], width=12)],
        [timeseries("Ethernet throughput", [
            (rate("gpufleet_network_transmit_bytes_total", NODE), "{{instance}} {{device}} tx"),
            (rate("gpufleet_network_receive_bytes_total", NODE), "{{instance}} {{device}} rx"),
        ], "Bps"),
         timeseries("InfiniBand throughput", [
             (rate("gpufleet_infiniband_port_xmit_data_bytes_total", NODE), PORT_LEGEND + " tx"),
             (rate("gpufleet_infiniband_port_rcv_data_bytes_total", NODE), PORT_LEGEND + " rx"),
         ], "Bps")],
        [table("InfiniBand ports", [
            (f"gpufleet_infiniband_state_id{{{NODE}}}", "state (4 active)"),
            (f"gpufleet_infiniband_physical_state_id{{{NODE}}}", "physical state (5 link up)"),
            (f"gpufleet_infiniband_rate_bytes_per_second{{{NODE}}}", "rate"),
            (f"increase(gpufleet_infiniband_link_downed_total{{{NODE}}}[24h])", "link downed 24h"),
            (f"increase(gpufleet_infiniband_symbol_error_total{{{NODE}}}[24h])", "symbol errors 24h"),
        ], width=12),
         table("Jobs", [(f"gpufleet_gpu_job_info{{{GPU}}}", "")], width=12,
               description="The jobs the scheduler placed on these GPUs.")],
        [timeseries("Hardware sensors", [(f"gpufleet_hwmon_temperature_celsius{{{NODE}}}",
                                          "{{instance}} {{chip}} {{label}}")], "celsius"),
         timeseries("Thermal zones", [(f"gpufleet_thermal_zone_temperature_celsius{{{NODE}}}",
                                       "{{instance}} {{type}}")], "celsius")],
    ],
    related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-gpu-health", "GPU health"),
             ("gpufleet-fabric", "Network fabric")],
)
