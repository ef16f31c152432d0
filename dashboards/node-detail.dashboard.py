"""Node detail: one node's GPUs, links, sensors and jobs, for the engineer who was sent here by an alert."""

from grafanalib.core import Dashboard

from gpufleet.alerts.config import Config
from gpufleet.dashboards.panels import PORT_LEGEND, Scope, Sized, dashboard, stat, table, timeseries

_BY_GPU = "{{instance}} GPU {{gpu}}"


def _beside(config: Config, s: Scope) -> list[list[Sized]]:
    """What blackbox_exporter and ipmi_exporter say of the node, where the site scrapes them: whether the node
    answers at all, and its BMC's own judgement of its power supplies, fans and air. Their series carry the node's
    instance as the scrape jobs relabel it (docs/deployment/probes.md, docs/exporter/ipmi-exporter.md) under their
    own job, not gpufleet's selector."""
    row: list[Sized] = []
    if config.probe_job:
        row.append(stat("Node answers its probe", f'min(probe_success{{job="{config.probe_job}", {s.recorded_node}}})',
                        width=4, thresholds=(("red", None), ("green", 1)),
                        description="blackbox_exporter's probe of the node itself: 0 with its exporter down is the "
                                    "node down (NodeUnreachable); 1 with it down is the exporter alone."))
    if config.ipmi_exporter_job:
        job = f'job="{config.ipmi_exporter_job}", {s.recorded_node}'
        row.append(table("BMC sensors not nominal", [
            (f"ipmi_sensor_state{{{job}}} > 0 or ipmi_fan_speed_state{{{job}}} > 0 "
             f"or ipmi_temperature_state{{{job}}} > 0", "state (1 warning, 2 critical)")], width=10,
            description="ipmi_exporter's sensors the BMC judges off nominal: a failed power supply, a stopped fan, "
                        "a temperature past its threshold. Empty while all are nominal."))
        row.append(timeseries("Inlet temperature (BMC)", [
            (f'ipmi_temperature_celsius{{{job}, name=~"{config.inlet_sensor}"}}', "{{instance}} {{name}}")],
            "celsius", width=10, description="The air the node breathes in, as its BMC reads it: above its limit "
                                             "every GPU runs warm (NodeInletTemperatureHigh)."))
    return [row] if row else []


def build(config: Config) -> Dashboard:
    s = Scope(config)
    node, gpu = s.node, s.gpu
    return dashboard(
        s, "gpufleet-node", "gpufleet / Node detail",
        "Per GPU utilisation, memory, power, temperatures, clocks and errors; the node's NICs, sensors and jobs.",
        ["cluster", "instance", "gpu"],
        [
            [stat("GPUs up", f"sum(gpufleet_gpu_up{{{node}}})", width=3),
             stat("GPUs NVML lists", f"sum(gpufleet_gpu_devices{{{node}}})", width=3,
                  description="Fewer than the PCI devices means a GPU fell off the bus before the exporter started."),
             stat("NVIDIA PCI devices", f"sum(gpufleet_gpu_pci_devices{{{node}}})", width=3),
             stat("GPU utilisation", f"avg(gpufleet_gpu_utilization_ratio{{{gpu}}})", "percentunit", width=3),
             stat("Tensor active", f"avg(gpufleet_gpu_tensor_active_ratio{{{gpu}}})", "percentunit", width=3,
                  description="Share of time the tensor pipes worked (GPM; no data on boards before Hopper)."),
             stat("Power", f"sum(gpufleet_gpu_power_watts{{{gpu}}})", "watt"),
             stat("Firing alerts", f'count(ALERTS{{alertstate="firing", {s.recorded_node}}}) or vector(0)', width=5,
                  thresholds=(("green", None), ("orange", 1)))],
            [timeseries("GPU utilisation: busy and doing math", [
                (f"gpufleet_gpu_utilization_ratio{{{gpu}}}", _BY_GPU + " busy"),
                (f"gpufleet_gpu_tensor_active_ratio{{{gpu}}}", _BY_GPU + " tensor"),
            ], "percentunit", max_value=1,
                description="Busy: a kernel ran (NVML). Tensor: the tensor pipes worked (GPM, Hopper and newer)."),
             timeseries("GPU memory used", [
                 (f"gpufleet_gpu_memory_used_bytes{{{gpu}}} / gpufleet_gpu_memory_total_bytes{{{gpu}}}", _BY_GPU)],
                 "percentunit", max_value=1)],
            [timeseries("Power against limit", [
                (f"gpufleet_gpu_power_watts{{{gpu}}} / gpufleet_gpu_power_limit_watts{{{gpu}}}", _BY_GPU)],
                "percentunit", description="Board power as a share of the enforced power limit."),
             timeseries("Temperature", [
                 (f"gpufleet_gpu_temperature_celsius{{{gpu}}}", _BY_GPU + " core"),
                 (f"gpufleet_gpu_memory_temperature_celsius{{{gpu}}}", _BY_GPU + " memory"),
             ], "celsius")],
            [timeseries("Thermal margin", [(f"gpufleet_gpu_thermal_margin_celsius{{{gpu}}}", _BY_GPU)], "celsius",
                        width=8, description="Degrees below the slowdown temperature; near 0 the GPU throttles."),
             timeseries("SM clock", [(f'gpufleet_gpu_clock_hertz{{{gpu}, clock="sm"}}', _BY_GPU)], "hertz", width=8),
             timeseries("Memory clock", [(f'gpufleet_gpu_clock_hertz{{{gpu}, clock="memory"}}', _BY_GPU)], "hertz",
                        width=8)],
            [timeseries("Active clock-event reasons", [
                (f'sum by (reason) (gpufleet_gpu_clock_event_active{{{gpu}, reason!="gpu_idle"}})', "{{reason}}")],
                "short", stacked=True, description="GPUs whose clocks are held down, per reason."),
             timeseries("XIDs", [(f"sum by (instance, gpu, xid) (increase(gpufleet_gpu_xid_errors_total{{{gpu}}}"
                                  "[$__rate_interval]))", _BY_GPU + " XID {{xid}}")], "short")],
            [timeseries("ECC errors", [(f"sum by (instance, gpu, error) (increase(gpufleet_gpu_ecc_errors_total"
                                        f'{{{gpu}, scope="volatile"}}[$__rate_interval]))', _BY_GPU + " {{error}}")],
                        "short", width=8),
             timeseries("Remapped rows", [(f"gpufleet_gpu_remapped_rows{{{gpu}}}", _BY_GPU + " {{cause}}")], "short",
                        width=8),
             timeseries("PCIe replays", [(s.rate("gpufleet_gpu_pcie_replays_total", gpu), _BY_GPU)], "ops", width=8)],
            [timeseries("NVLink throughput", [
                (f"sum by (instance, gpu) ({s.rate('gpufleet_gpu_nvlink_transmit_bytes_total', gpu)})",
                 _BY_GPU + " tx"),
                (f"sum by (instance, gpu) ({s.rate('gpufleet_gpu_nvlink_receive_bytes_total', gpu)})",
                 _BY_GPU + " rx"),
            ], "Bps", width=8),
             timeseries("NVLink errors", [
                 (f"sum by (instance, gpu, error) ({s.rate('gpufleet_gpu_nvlink_errors_total', gpu)})",
                  _BY_GPU + " {{error}}")], "ops", width=8),
             timeseries("NVLinks up", [(f"gpufleet_gpu_nvlink_links_up{{{gpu}}}", _BY_GPU)], "short",
                        width=8, description="A step down is a link lost; its traffic moves to the others or stops.")],
            [table("PCIe links and NVSwitch fabric", [
                (f"gpufleet_gpu_pcie_link_width{{{gpu}}}", "width"),
                (f"gpufleet_gpu_pcie_link_max_width{{{gpu}}}", "max width"),
                (f"gpufleet_gpu_pcie_link_generation{{{gpu}}}", "generation"),
                (f"gpufleet_gpu_pcie_link_max_generation{{{gpu}}}", "max generation"),
                (f"gpufleet_gpu_fabric_state{{{gpu}}}", "fabric (3 registered)"),
                (f"gpufleet_gpu_fabric_health{{{gpu}}}", "fabric health (1 healthy)"),
            ], width=12, description="A link narrower or slower than its maximum starves the GPU of host bandwidth; a "
                                     "GPU not registered with its NVSwitch fabric cannot reach its peers over NVLink "
                                     "(HGX boards only)."),
             table("GPUs", [(f"gpufleet_gpu_info{{{gpu}}}", "")], width=12)],
            [table("PCIe errors since boot (AER)", [
                (f'sum without (type) (gpufleet_pcie_aer_errors_total{{{node}, type="{kind}"}})', kind)
                for kind in ("correctable", "nonfatal", "fatal")],
                width=18, description="Each GPU's, NVSwitch's and NIC's link, counted at the device and at the port "
                                      "above it: uncorrectable errors are a ticket, and so are corrections that go "
                                      "on."),
             stat("PCIe links without AER", f"sum(gpufleet_pcie_links_without_aer{{{node}}})", width=6,
                  thresholds=(("green", None), ("orange", 1)),
                  description="Links whose errors cannot be read: AER is off in the firmware, or the device lacks "
                              "it. Their errors show nowhere above.")],
            [table("NVSwitch errors since boot (SXids)", [
                (f"gpufleet_nvswitch_sxid_errors_total{{{node}}}", "")], width=18,
                description="Each switch's errors by code and class, as the driver logged them: a fatal one stalls "
                            "the board's NVLink fabric and holds every GPU at a reset until the whole board is "
                            "reset. Empty where no switch has erred."),
             stat("Kernel log readable", f"min(gpufleet_kernel_log_readable{{{node}}})", width=6,
                  thresholds=(("orange", None), ("green", 1)),
                  description="0: the exporter cannot read the kernel log, and neither SXids nor host trouble "
                              "(soft lockups, storage timeouts) are counted on this node.")],
            [table("Recovery actions held", [(f"gpufleet_gpu_recovery_action_reason{{{gpu}}}", "since")],
                   width=12, description="Why each GPU is held at its recovery action (gpufleet_gpu_recovery_action: "
                                         "2 reset, 3 reboot, 4 replace), and since when (Unix time); held until the "
                                         "exporter sees the repair done. Empty where no GPU needs one."),
             timeseries("Storage timeouts by server", [
                 (f"sum by (instance, server) (increase(gpufleet_kernel_storage_timeouts_total{{{node}}}"
                  "[$__rate_interval]))", "{{instance}} {{server}}")], "short", width=12,
                 description="NFS servers and Lustre targets the kernel logged as not responding. The same server on "
                             "many nodes at once is the file system's outage (NodesStorageTimeouts).")],
            *_beside(config, s),
            [timeseries("Ethernet throughput", [
                (s.rate("gpufleet_network_transmit_bytes_total", node), "{{instance}} {{device}} tx"),
                (s.rate("gpufleet_network_receive_bytes_total", node), "{{instance}} {{device}} rx"),
            ], "Bps"),
             timeseries("InfiniBand throughput", [
                 (s.rate("gpufleet_infiniband_port_xmit_data_bytes_total", node), PORT_LEGEND + " tx"),
                 (s.rate("gpufleet_infiniband_port_rcv_data_bytes_total", node), PORT_LEGEND + " rx"),
             ], "Bps")],
            [table("InfiniBand ports", [
                (f"{s.series('gpufleet_infiniband_state_id', node)}", "state (4 active)"),
                (f"{s.series('gpufleet_infiniband_physical_state_id', node)}", "physical state (5 link up)"),
                (f"{s.series('gpufleet_infiniband_rate_bytes_per_second', node)}", "rate"),
                (f"increase({s.series('gpufleet_infiniband_link_downed_total', node)}[24h])", "link downed 24h"),
                (f"increase({s.series('gpufleet_infiniband_symbol_error_total', node)}[24h])", "symbol errors 24h"),
            ], width=12),
             table("Jobs", [(f"gpufleet_gpu_job_info{{{gpu}}}", "")], width=12,
                   description="The jobs the scheduler placed on these GPUs.")],
            [timeseries("Hardware sensors", [(f"{s.series('gpufleet_hwmon_temperature_celsius', node)}",
                                              "{{instance}} {{chip}} {{label}}")], "celsius", width=8),
             timeseries("Thermal zones", [(f"{s.series('gpufleet_thermal_zone_temperature_celsius', node)}",
                                           "{{instance}} {{type}}")], "celsius", width=8),
             timeseries("Node power", [
                 (f"sum by (instance) ({config.power_meter(s.recorded_node)})", "{{instance}} node"),
                 (f"sum by (instance) (gpufleet_gpu_power_watts{{{node}}})", "{{instance}} all GPUs"),
             ], "watt", width=8, description="The node's own power meter, where it has one, beside its GPUs' boards: "
                                             "the gap is the CPUs, NICs, fans and drives.")],
        ],
        related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-gpu-health", "GPU health"),
                 ("gpufleet-fabric", "Network fabric")],
        single=["instance"],
    )
