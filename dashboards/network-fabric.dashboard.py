"""Network fabric: which links are full, congested, erroring or flapping, per node and port.

Throughput is shown as a share of the link's own speed, so a 100 GbE port and a 400 Gb/s
InfiniBand port read on one scale; congestion is `port_xmit_wait`, the time a port had data
to send and no credits, which rises before throughput falls.
"""

from grafanalib.core import Dashboard

from gpufleet.alerts.config import Config
from gpufleet.dashboards.panels import PORT_LEGEND, Scope, dashboard, heatmap, table, timeseries

# Every per-port error counter; their rates add up to one "errors per second" line per port.
_IB_ERRORS = ("symbol_error", "port_rcv_errors", "link_error_recovery", "local_link_integrity_errors",
              "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors", "vl15_dropped")


def build(config: Config) -> Dashboard:
    s = Scope(config)
    node = s.node
    ib_key = s.by("instance", "device", "port")

    def ib_share(counter: str) -> str:
        return f"{s.rate(counter, node)} / on ({ib_key}) gpufleet_infiniband_rate_bytes_per_second{{{node}}}"

    def eth_share(counter: str) -> str:
        return (f"{s.rate(counter, node)} / on ({s.by('instance', 'device')}) "
                f"gpufleet_network_speed_bytes_per_second{{{node}}}")

    return dashboard(
        s, "gpufleet-fabric", "gpufleet / Network fabric",
        "Throughput as a share of link speed, InfiniBand congestion, errors, discards, link state, flaps, RoCE drops.",
        ["cluster", "instance"],
        [
            [timeseries("InfiniBand throughput, share of link rate", [
                (ib_share("gpufleet_infiniband_port_xmit_data_bytes_total"), PORT_LEGEND + " tx"),
                (ib_share("gpufleet_infiniband_port_rcv_data_bytes_total"), PORT_LEGEND + " rx"),
            ], "percentunit", max_value=1),
             timeseries("Ethernet throughput, share of link speed", [
                 (eth_share("gpufleet_network_transmit_bytes_total"), "{{instance}} {{device}} tx"),
                 (eth_share("gpufleet_network_receive_bytes_total"), "{{instance}} {{device}} rx"),
             ], "percentunit", max_value=1)],
            [heatmap("Busiest direction per InfiniBand port", "max by (instance, device, port) ("
                     + ib_share("gpufleet_infiniband_port_xmit_data_bytes_total") + " or "
                     + ib_share("gpufleet_infiniband_port_rcv_data_bytes_total") + ")", PORT_LEGEND, "percentunit")],
            [timeseries("InfiniBand congestion (port_xmit_wait)", [
                (s.rate("gpufleet_infiniband_port_xmit_wait_total", node), PORT_LEGEND)], "short",
                description="Ticks per second a port waited for credits with data to send. The tick length "
                            "depends on the HCA; compare ports of one fabric, not fabrics."),
             timeseries("Discards", [
                 (s.rate("gpufleet_infiniband_port_xmit_discards_total", node), PORT_LEGEND + " xmit discards"),
                 (s.rate("gpufleet_network_transmit_dropped_total", node), "{{instance}} {{device}} tx dropped"),
                 (s.rate("gpufleet_network_receive_dropped_total", node), "{{instance}} {{device}} rx dropped"),
             ], "pps")],
            [timeseries("InfiniBand errors", [
                ("(" + " + ".join(s.rate(f"gpufleet_infiniband_{c}_total", node) for c in _IB_ERRORS) + ") > 0",
                 PORT_LEGEND)],
                "ops",
                description="Symbol, receive, integrity, recovery, overrun, remote physical and VL15 errors "
                            "together; only ports with errors are drawn. The node's table splits them by counter."),
             timeseries("Ethernet errors", [
                 (s.rate("gpufleet_network_transmit_errors_total", node), "{{instance}} {{device}} tx"),
                 (s.rate("gpufleet_network_receive_errors_total", node), "{{instance}} {{device}} rx"),
             ], "ops")],
            [timeseries("Link flaps", [
                (f"increase(gpufleet_infiniband_link_downed_total{{{node}}}[$__rate_interval])",
                 PORT_LEGEND + " downed"),
                (f"increase(gpufleet_network_carrier_changes_total{{{node}}}[$__rate_interval])",
                 "{{instance}} {{device}} carrier changes"),
            ], "short"),
             timeseries("RoCE drops and retransmissions", [
                 (s.rate("gpufleet_infiniband_hw_out_of_buffer_total", node), PORT_LEGEND + " out of buffer"),
                 (s.rate("gpufleet_infiniband_hw_out_of_sequence_total", node), PORT_LEGEND + " out of sequence"),
                 (s.rate("gpufleet_infiniband_hw_packet_seq_err_total", node), PORT_LEGEND + " sequence errors (NAK)"),
                 (s.rate("gpufleet_infiniband_hw_local_ack_timeout_err_total", node), PORT_LEGEND + " ack timeouts"),
             ], "ops", description="HCA counters of RoCE ports: packets lost for want of buffers, and what the "
                                   "transport did about it.")],
            [table("Ports not active", [
                (f"gpufleet_infiniband_state_id{{{node}}} != 4", "state (4 active)"),
                (f"gpufleet_infiniband_physical_state_id{{{node}}} and on ({ib_key}) "
                 f"gpufleet_infiniband_state_id{{{node}}} != 4", "physical state (5 link up)"),
            ], width=12, node_link=s,
                description="InfiniBand ports whose logical state is not Active; physical state 2 (Polling) means "
                            "no link partner, 3 (Disabled) a port switched off on purpose."),
             table("Ports below the node's fastest rate", [
                 (f"gpufleet_infiniband_rate_bytes_per_second{{{node}}} < on ({s.by('instance')}) group_left "
                  f"max by ({s.by('instance')}) (gpufleet_infiniband_rate_bytes_per_second{{{node}}})", "rate")],
                 "Bps", width=12, node_link=s, description="Links trained down to a slower rate than their peers.")],
            [table("Flapping and erroring ports, last 24h", [
                (f"increase(gpufleet_infiniband_link_downed_total{{{node}}}[24h]) > 0", "link downed"),
                (f"increase(gpufleet_infiniband_symbol_error_total{{{node}}}[24h]) > 0", "symbol errors"),
            ], node_link=s)],
        ],
        related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-node", "Node detail")],
    )
