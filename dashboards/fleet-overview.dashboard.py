"""Fleet overview: is the fleet healthy, where is it hurting? The on-call engineer's first page."""

from grafanalib.core import Dashboard

from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import LINK_UTILIZATION, POWER, SM_ACTIVE, TENSOR_ACTIVE, UTILIZATION
from gpufleet.dashboards.panels import Scope, dashboard, heatmap, stat, table, timeseries


def build(config: Config) -> Dashboard:
    s = Scope(config)
    firing = f'alertstate="firing", {s.recorded}'
    return dashboard(
        s, "gpufleet-fleet", "gpufleet / Fleet overview",
        "GPUs up and lost, failing GPUs and alerts, utilisation and power, stragglers and saturated links.",
        ["cluster"],
        [
            [stat("GPUs", f"sum(gpufleet_gpu_devices{{{s.cluster}}})", description="GPUs NVML lists, fleet-wide."),
             stat("GPUs up", f"count(gpufleet_gpu_up{{{s.cluster}}} == 1) or vector(0)"),
             stat("GPUs lost", f"count(gpufleet_gpu_up{{{s.cluster}}} == 0) or vector(0)",
                  thresholds=(("green", None), ("red", 1))),
             stat("Failing GPUs", f"count(count by ({s.by('instance', 'gpu')}) (ALERTS{{{firing}, "
                                  'severity="critical", alertname=~"Gpu.*"})) or vector(0)',
                  description="GPUs with a firing critical alert.", thresholds=(("green", None), ("red", 1))),
             stat("Critical alerts", f'count(ALERTS{{{firing}, severity="critical"}}) or vector(0)',
                  thresholds=(("green", None), ("red", 1))),
             stat("Warning alerts", f'count(ALERTS{{{firing}, severity="warning"}}) or vector(0)',
                  thresholds=(("green", None), ("orange", 1)))],
            [timeseries("GPU utilisation: busy and doing math", [
                (f"avg({UTILIZATION}{{{s.recorded}}})", "busy (NVML), mean"),
                (f"quantile(0.1, {UTILIZATION}{{{s.recorded}}})", "busy, p10 node"),
                (f"avg({SM_ACTIVE}{{{s.recorded}}})", "SM active, mean"),
                (f"avg({TENSOR_ACTIVE}{{{s.recorded}}})", "tensor active, mean"),
            ], "percentunit", max_value=1,
                description="Busy is NVML's share of time a kernel ran, which NCCL waiting on a slow peer fills too. "
                            "SM and tensor activity (GPM, Hopper and newer; nodes without it are left out) say how "
                            "much of that was work."),
             timeseries("Power", [(f"sum by ({s.label}) ({POWER}{{{s.recorded}}})",
                                   s.legend)], "watt")],
            [heatmap("Utilisation per node", f"{UTILIZATION}{{{s.recorded}}}",
                     "{{instance}}", "percentunit")],
            [table("Hottest GPUs", [(f"topk(10, gpufleet_gpu_temperature_celsius{{{s.cluster}}})", "")], "celsius",
                   width=8, node_link=s),
             table("Stragglers", [(f'ALERTS{{alertname="NodeStraggler", {firing}}}', "")], width=8, node_link=s,
                   description="Nodes holding back their job (NodeStraggler firing)."),
             table("Saturated links",
                   [(f"{LINK_UTILIZATION}{{{s.recorded}}} > {config.saturation_warning:g}", "")],
                   "percentunit", width=8, node_link=s,
                   description=f"Ports above {config.saturation_warning:.0%} of their link speed.")],
        ],
        related=[("gpufleet-node", "Node detail"), ("gpufleet-gpu-health", "GPU health"),
                 ("gpufleet-fabric", "Network fabric"), ("gpufleet-jobs", "Jobs and stragglers"),
                 ("gpufleet-capacity", "Capacity")],
    )
