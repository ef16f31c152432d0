"""Network fabric: which links are full, congested, erroring or flapping, per node and port.

Throughput is shown as a share of the link's own speed, so a 100 GbE port and a 400 Gb/s
InfiniBand port read on one scale; congestion is `port_xmit_wait`, the time a port had data
to send and no credits, which rises before throughput falls. Utilisation and congestion come from
the recorded per-port series the alerts read (5-minute rates), the fleet's ports from their per-node
counts by utilisation, the InfiniBand errors from the capacity rules' sparse per-port series, and the
ports not active from the pager's: at All, a rate over every port's raw counters would cost Prometheus
seconds per refresh. The tables drop metric names, so that Grafana merges a port's columns into one row.
"""

from grafanalib.core import Dashboard

from gpufleet.alerts.capacity import IB_ERRORS, INTERVAL, WINDOW
from gpufleet.alerts.config import Config
from gpufleet.alerts.fabric import NOT_ACTIVE
from gpufleet.alerts.recording import LINK_UTILIZATION, NODE_IB_RATE, PORT_BUCKETS, RATE_WINDOW, XMIT_WAIT
from gpufleet.dashboards.panels import PORT_LEGEND, Scope, dashboard, heatmap, table, timeseries
from gpufleet.duration import spoken


def build(config: Config) -> Dashboard:
    s = Scope(config)
    node = s.node
    ib_key = s.by("instance", "device", "port")

    def share(class_: str, direction: str) -> str:
        return f'{LINK_UTILIZATION}{{{s.recorded_node}, class="{class_}", direction="{direction}"}}'

    over = f"Over {spoken(RATE_WINDOW)}, as the saturation alerts see it."
    return dashboard(
        s, "gpufleet-fabric", "gpufleet / Network fabric",
        "Throughput as a share of link speed, InfiniBand congestion, errors, discards, link state, flaps, RoCE drops.",
        ["cluster", "instance"],
        [
            [timeseries("InfiniBand throughput, share of link rate", [
                (share("infiniband", "transmit"), PORT_LEGEND + " tx"),
                (share("infiniband", "receive"), PORT_LEGEND + " rx"),
            ], "percentunit", max_value=1, description=over),
             timeseries("Ethernet throughput, share of link speed", [
                 (share("net", "transmit"), "{{instance}} {{device}} tx"),
                 (share("net", "receive"), "{{instance}} {{device}} rx"),
             ], "percentunit", max_value=1, description=over)],
            [heatmap("InfiniBand ports by utilisation of their busier direction",
                     f"sum by (bucket) ({PORT_BUCKETS}{{{s.recorded_node}}})", "{{bucket}}", "percentunit",
                     buckets=True,
                     description="How many of the selected nodes' ports ran at each share of their link rate, in "
                                 f"steps of 5 %, over {spoken(RATE_WINDOW)} and in the busier direction; a row is a "
                                 "step. A band near the top is a saturated fabric; a few ports there, a hot spot, "
                                 "which the throughput panel above names.")],
            [timeseries("InfiniBand congestion (port_xmit_wait)", [
                (f"{XMIT_WAIT}{{{s.recorded_node}}}", PORT_LEGEND)], "short",
                description="Ticks per second a port waited for credits with data to send, over "
                            f"{spoken(RATE_WINDOW)}. The tick length depends on the HCA; compare ports of one "
                            "fabric, not fabrics."),
             timeseries("Discards", [
                 (s.rate("gpufleet_infiniband_port_xmit_discards_total", node), PORT_LEGEND + " xmit discards"),
                 (s.rate("gpufleet_network_transmit_dropped_total", node), "{{instance}} {{device}} tx dropped"),
                 (s.rate("gpufleet_network_receive_dropped_total", node), "{{instance}} {{device}} rx dropped"),
             ], "pps")],
            [timeseries("InfiniBand errors", [(f"{IB_ERRORS}{{{s.recorded_node}}}", PORT_LEGEND)], "ops",
                        description="Symbol, receive, integrity, recovery, overrun, remote physical and VL15 errors "
                                    f"together, over {spoken(WINDOW)}, recorded every {spoken(INTERVAL)} by the "
                                    "capacity rules; only ports with errors are drawn. The node's table splits them by "
                                    "counter."),
             timeseries("Ethernet errors", [
                 (s.rate("gpufleet_network_transmit_errors_total", node), "{{instance}} {{device}} tx"),
                 (s.rate("gpufleet_network_receive_errors_total", node), "{{instance}} {{device}} rx"),
             ], "ops")],
            [timeseries("Link flaps", [
                (f"increase({s.series('gpufleet_infiniband_link_downed_total', node)}[$__rate_interval])",
                 PORT_LEGEND + " downed"),
                (f"increase({s.series('gpufleet_network_carrier_changes_total', node)}[$__rate_interval])",
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
                (f"max by ({ib_key}) ({NOT_ACTIVE}{{{s.recorded_node}}})", "state (4 active)"),
                (f"max by ({ib_key}) ({s.series('gpufleet_infiniband_physical_state_id', node)}) and on ({ib_key}) "
                 f"{NOT_ACTIVE}{{{s.recorded_node}}}", "physical state (5 link up)"),
            ], width=12, node_link=s,
                description="InfiniBand ports whose logical state is not Active; physical state 2 (Polling) means "
                            "no link partner, 3 (Disabled) a port switched off on purpose."),
             table("Ports below the node's fastest rate", [
                 (f"{s.series('gpufleet_infiniband_rate_bytes_per_second', node)} < on ({s.by('instance')}) group_left "
                  f"{NODE_IB_RATE}{{{s.recorded_node}}}", "rate")],
                 "Bps", width=12, node_link=s, description="Links trained down to a slower rate than their peers.")],
            [table("Flapping and erroring ports, last 24h", [
                (f"increase({s.series('gpufleet_infiniband_link_downed_total', node)}[24h]) > 0", "link downed"),
                (f"increase({s.series('gpufleet_infiniband_symbol_error_total', node)}[24h]) > 0", "symbol errors"),
            ], node_link=s)],
        ],
        related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-node", "Node detail")],
    )
