"""GPU health: which GPUs to drain, and why. XIDs by code and class, memory errors, links, slowdowns, lost boards.

At All this dashboard looks at every GPU of the fleet, so its graphs read series that exist only for GPUs
with something to show: the XID counters, the recorded new-ECC, PCIe-replay and slowdown series the alerts
read, and the per-link NVLink error counters, which the exporter adds from a link's first error on.
"""

from grafanalib.core import Dashboard

from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import ECC_NEW, PCIE_REPLAYS, RATE_WINDOW, SLOWDOWN
from gpufleet.alerts.rule import matcher
from gpufleet.dashboards.panels import Scope, dashboard, table, timeseries
from gpufleet.duration import spoken
from gpufleet.xid import CLASSES


def build(config: Config) -> Dashboard:
    s = Scope(config)
    gpu = s.gpu
    recorded_gpu = f'{s.recorded_node}, gpu=~"$gpu"'
    row = s.by("instance", "gpu", "uuid")  # With the cluster, which the link to the node's dashboard carries.
    return dashboard(
        s, "gpufleet-gpu-health", "gpufleet / GPU health",
        "XIDs by code and class, ECC and remapped rows, PCIe replays, NVLink errors, slowdowns and lost GPUs.",
        ["cluster", "instance", "gpu"],
        [
            [timeseries("XIDs by code", [(f"sum by (xid) (increase(gpufleet_gpu_xid_errors_total{{{gpu}}}"
                                          "[$__rate_interval]))", "XID {{xid}}")], "short"),
             timeseries("XIDs by class", [
                 (f"sum(increase(gpufleet_gpu_xid_errors_total{{{gpu}, {matcher(codes)}}}[$__rate_interval]))", name)
                 for name, codes in CLASSES.items()], "short")],
            [timeseries("Uncorrected ECC errors", [
                (f"sum by (instance, gpu) ({ECC_NEW}{{{recorded_gpu}}})", "{{instance}} GPU {{gpu}}")], "short",
                width=8, description="Errors counted in the minute before each point."),
             timeseries("Remapped rows", [(f"gpufleet_gpu_remapped_rows{{{gpu}}} > 0",
                                           "{{instance}} GPU {{gpu}} {{cause}}")], "short", width=8,
                        description="GPUs that have remapped rows; the node's dashboard draws every GPU's count."),
             timeseries("PCIe replays", [(f"{PCIE_REPLAYS}{{{recorded_gpu}}}", "{{instance}} GPU {{gpu}}")], "ops",
                        width=8, description=f"Over {spoken(RATE_WINDOW)}.")],
            [timeseries("NVLink errors", [
                (f"sum by (instance, gpu, error) ({s.rate('gpufleet_gpu_nvlink_link_errors_total', gpu)})",
                 "{{instance}} GPU {{gpu}} {{error}}")], "ops",
                description="From the links that have erred: a link's error counters appear at its first error, "
                            "so that first error itself is not drawn. The node's dashboard has every GPU's totals."),
             timeseries("GPUs held down, by reason", [
                 (f"count by (reason) ({SLOWDOWN}{{{recorded_gpu}}})", "{{reason}}")], "short", stacked=True,
                 description="GPUs whose clocks a hardware slowdown, thermal slowdown or power brake holds down.")],
            [table("GPUs to drain", [
                (f"max by ({row}) (gpufleet_gpu_recovery_action{{{gpu}}} > 0)", "action"),
                (f"sum by ({row}) (increase(gpufleet_gpu_xid_errors_total{{{gpu}}}[24h]))", "XIDs 24h"),
                (f'sum by ({row}) (increase(gpufleet_gpu_ecc_errors_total{{{gpu}, '
                 'error="uncorrected", scope="volatile"}[24h]))', "uncorrected ECC 24h"),
                (f"max by ({row}) (gpufleet_gpu_row_remap_pending{{{gpu}}})", "remap pending"),
                (f"max by ({row}) (gpufleet_gpu_row_remap_failed{{{gpu}}})", "remap failed"),
                (f"sum by ({row}) (increase(gpufleet_gpu_pcie_replays_total{{{gpu}}}[24h]))", "PCIe replays 24h"),
            ], height=10, node_link=s,
                description="One row per GPU; sort by any column to find the GPUs to drain first. Action is "
                            "what the GPU needs, held until it is done: 1 drain, 2 reset, 3 reboot, 4 replace."),
             ],
            [table("Lost GPUs", [(f"gpufleet_gpu_up{{{gpu}}} == 0", "")], width=12, node_link=s,
                   description="GPUs NVML no longer answers for."),
             table("Active hardware slowdowns", [(f"{SLOWDOWN}{{{recorded_gpu}}}", "")], width=12,
                   description="As the first tier of the rules recorded them, every minute: reading every GPU's "
                               "reasons at All costs a thousand-node Prometheus a second.")],
        ],
        related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-node", "Node detail")],
    )
