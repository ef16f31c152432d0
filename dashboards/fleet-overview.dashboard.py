"""Fleet overview: is the fleet healthy, where is it hurting? The on-call engineer's first page."""

from gpufleet.dashboards.panels import CLUSTER, dashboard, heatmap, stat, table, timeseries

FIRING = f'alertstate="firing", {CLUSTER}'

dashboard = dashboard(
    "gpufleet-fleet", "gpufleet / Fleet overview",
    "GPUs up and lost, failing GPUs and alerts, utilisation and power, stragglers and saturated links.",
    ["cluster"],
    [
        [stat("GPUs", f"sum(gpufleet_gpu_devices{{{CLUSTER}}})", description="GPUs NVML lists, fleet-wide."),
         stat("GPUs up", f"count(gpufleet_gpu_up{{{CLUSTER}}} == 1) or vector(0)"),
         stat("GPUs lost", f"count(gpufleet_gpu_up{{{CLUSTER}}} == 0) or vector(0)",
              thresholds=(("green", None), ("red", 1))),
         stat("Failing GPUs", f'count(count by (cluster, instance, gpu) (ALERTS{{{FIRING}, severity="critical", '
                              f'alertname=~"Gpu.*"}})) or vector(0)',
              description="GPUs with a firing critical alert.", thresholds=(("green", None), ("red", 1))),
         stat("Critical alerts", f'count(ALERTS{{{FIRING}, severity="critical"}}) or vector(0)',
              thresholds=(("green", None), ("red", 1))),
         stat("Warning alerts", f'count(ALERTS{{{FIRING}, severity="warning"}}) or vector(0)',
              thresholds=(("green", None), ("orange", 1)))],
        [timeseries("GPU utilisation", [
            (f"avg(instance:gpufleet_gpu_utilization_ratio:avg{{{CLUSTER}}})", "mean"),
            (f"quantile(0.1, instance:gpufleet_gpu_utilization_ratio:avg{{{CLUSTER}}})", "p10 node"),
        ], "percentunit", max_value=1),
         timeseries("Power", [(f"sum by (cluster) (instance:gpufleet_gpu_power_watts:sum{{{CLUSTER}}})",
                               "{{cluster}}")], "watt")],
        [heatmap("Utilisation per node", f"instance:gpufleet_gpu_utilization_ratio:avg{{{CLUSTER}}}", "{{instance}}",
                 "percentunit")],
        [table("Hottest GPUs", [(f"topk(10, gpufleet_gpu_temperature_celsius{{{CLUSTER}}})", "")], "celsius",
               width=8, node_link=True),
         table("Stragglers", [(f'ALERTS{{alertname="NodeStraggler", {FIRING}}}', "")], width=8, node_link=True,
               description="Nodes holding back their job (NodeStraggler firing)."),
         table("Saturated links", [(f"instance_port:gpufleet_link_utilization:ratio_rate5m{{{CLUSTER}}} > 0.8", "")],
               "percentunit", width=8, node_link=True, description="Ports above 80% of their link speed.")],
    ],
    related=[("gpufleet-node", "Node detail"), ("gpufleet-gpu-health", "GPU health"),
             ("gpufleet-fabric", "Network fabric"), ("gpufleet-jobs", "Jobs and stragglers"),
             ("gpufleet-capacity", "Capacity")],
)
