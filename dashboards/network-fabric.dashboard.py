"""Network fabric: which links are full, congested, erroring or flapping, per node and port.

Throughput is shown as a share of the link's own speed, so a 100 GbE port and a 400 Gb/s
InfiniBand port read on one scale; congestion is `port_xmit_wait`, the time a port had data
to send and no credits, which rises before throughput falls.
"""

from gpufleet.dashboards.panels import NODE, PORT_LEGEND, dashboard, heatmap, rate, table, timeseries

_IB_KEY = "cluster, instance, device, port"


def _ib_share(counter: str) -> str:
    return f"{rate(counter, NODE)} / on ({_IB_KEY}) gpufleet_infiniband_rate_bytes_per_second{{{NODE}}}"


def _eth_share(counter: str) -> str:
    return f"{rate(counter, NODE)} / on (cluster, instance, device) gpufleet_network_speed_bytes_per_second{{{NODE}}}"


# Every per-port error counter; their rates add up to one "errors per second" line per port.
_IB_ERRORS = ("symbol_error", "port_rcv_errors", "link_error_recovery", "local_link_integrity_errors",
              "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors", "vl15_dropped")


dashboard = dashboard(
    "gpufleet-fabric", "gpufleet / Network fabric",
    "Throughput as a share of link speed, InfiniBand congestion, errors, discards, link state, flaps, RoCE drops.",
    ["cluster", "instance"],
    [
        [timeseries("InfiniBand throughput, share of link rate", [
            (_ib_share("gpufleet_infiniband_port_xmit_data_bytes_total"), PORT_LEGEND + " tx"),
            (_ib_share("gpufleet_infiniband_port_rcv_data_bytes_total"), PORT_LEGEND + " rx"),
        ], "percentunit", max_value=1),
         timeseries("Ethernet throughput, share of link speed", [
             (_eth_share("gpufleet_network_transmit_bytes_total"), "{{instance}} {{device}} tx"),
             (_eth_share("gpufleet_network_receive_bytes_total"), "{{instance}} {{device}} rx"),
         ], "percentunit", max_value=1)],
        [heatmap("Busiest direction per InfiniBand port", "max by (instance, device, port) ("
                 + _ib_share("gpufleet_infiniband_port_xmit_data_bytes_total") + " or "
                 + _ib_share("gpufleet_infiniband_port_rcv_data_bytes_total") + ")", PORT_LEGEND, "percentunit")],
        [timeseries("InfiniBand congestion (port_xmit_wait)", [
            (rate("gpufleet_infiniband_port_xmit_wait_total", NODE), PORT_LEGEND)], "short",
            description="Ticks per second a port waited for credits with data to send. The tick length depends "
                        "on the HCA; compare ports of one fabric, not fabrics."),
         timeseries("Discards", [
             (rate("gpufleet_infiniband_port_xmit_discards_total", NODE), PORT_LEGEND + " xmit discards"),
             (rate("gpufleet_network_transmit_dropped_total", NODE), "{{instance}} {{device}} tx dropped"),
             (rate("gpufleet_network_receive_dropped_total", NODE), "{{instance}} {{device}} rx dropped"),
         ], "pps")],
        [timeseries("InfiniBand errors", [
            ("(" + " + ".join(rate(f"gpufleet_infiniband_{c}_total", NODE) for c in _IB_ERRORS) + ") > 0",
             PORT_LEGEND)],
            "ops",
            description="Symbol, receive, integrity, recovery, overrun, remote physical and VL15 errors together; "
                        "only ports with errors are drawn. The node's table splits them by counter."),
         timeseries("Ethernet errors", [
             (rate("gpufleet_network_transmit_errors_total", NODE), "{{instance}} {{device}} tx"),
             (rate("gpufleet_network_receive_errors_total", NODE), "{{instance}} {{device}} rx"),
         ], "ops")],
        [timeseries("Link flaps", [
            (f"increase(gpufleet_infiniband_link_downed_total{{{NODE}}}[$__rate_interval])", PORT_LEGEND + " downed"),
            (f"increase(gpufleet_network_carrier_changes_total{{{NODE}}}[$__rate_interval])",
             "{{instance}} {{device}} carrier changes"),
        ], "short"),
         timeseries("RoCE drops and retransmissions", [
             (rate("gpufleet_infiniband_hw_out_of_buffer_total", NODE), PORT_LEGEND + " out of buffer"),
             (rate("gpufleet_infiniband_hw_out_of_sequence_total", NODE), PORT_LEGEND + " out of sequence"),
             (rate("gpufleet_infiniband_hw_packet_seq_err_total", NODE), PORT_LEGEND + " sequence errors (NAK)"),
             (rate("gpufleet_infiniband_hw_local_ack_timeout_err_total", NODE), PORT_LEGEND + " ack timeouts"),
         ], "ops", description="HCA counters of RoCE ports: packets lost for want of buffers, and what the "
                               "transport did about it.")],
        [table("Ports not active", [
            (f"gpufleet_infiniband_state_id{{{NODE}}} != 4", "state (4 active)"),
            (f"gpufleet_infiniband_physical_state_id{{{NODE}}} and on ({_IB_KEY}) "
             f"gpufleet_infiniband_state_id{{{NODE}}} != 4", "physical state (5 link up)"),
        ], width=12, node_link=True,
            description="InfiniBand ports whose logical state is not Active; physical state 2 (Polling) means "
                        "no link partner, 3 (Disabled) a port switched off on purpose."),
         table("Ports below the node's fastest rate", [
             (f"gpufleet_infiniband_rate_bytes_per_second{{{NODE}}} < on (cluster, instance) group_left "
              f"max by (cluster, instance) (gpufleet_infiniband_rate_bytes_per_second{{{NODE}}})", "rate")],
             "Bps", width=12, node_link=True, description="Links trained down to a slower rate than their peers.")],
        [table("Flapping and erroring ports, last 24h", [
            (f"increase(gpufleet_infiniband_link_downed_total{{{NODE}}}[24h]) > 0", "link downed"),
            (f"increase(gpufleet_infiniband_symbol_error_total{{{NODE}}}[24h]) > 0", "symbol errors"),
        ], node_link=True)],
    ],
    related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-node", "Node detail")],
)
