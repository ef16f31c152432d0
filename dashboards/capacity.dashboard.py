"""Capacity: what the fleet has, how much of it jobs hold, and how much of what they hold they use.

GPU-hours over the dashboard's range are sums of per-interval counts (a subquery at the panel's
interval), so a GPU that joined halfway through counts for half the range, not all of it.
"""

from gpufleet.dashboards.panels import CLUSTER, dashboard, stat, table, timeseries

_GPU_KEY = "cluster, instance, gpu"
INSTALLED = f"gpufleet_gpu_info{{{CLUSTER}}}"
HEALTHY = f"gpufleet_gpu_up{{{CLUSTER}}} == 1"
JOBS = f"gpufleet_gpu_job_info{{{CLUSTER}}}"
ALLOCATED = f"count by ({_GPU_KEY}) ({JOBS})"
IDLE = f"{HEALTHY} unless on ({_GPU_KEY}) {JOBS}"
UTILIZATION = f"gpufleet_gpu_utilization_ratio{{{CLUSTER}}}"
_HOURS = "* $__interval_ms / 3600000"


def _gpu_hours(per_instant: str) -> str:
    """GPU-hours over the range from an expression that counts GPUs (or sums shares of GPUs) at an instant."""
    return f"sum_over_time(({per_instant})[$__range:$__interval]) {_HOURS}"


def _by_model(metric: str) -> str:
    return f"sum by (name) ({metric}{{{CLUSTER}}} * on ({_GPU_KEY}) group_left (name) {INSTALLED})"


dashboard = dashboard(
    "gpufleet-capacity", "gpufleet / Capacity",
    "GPUs by model, allocated against idle, utilisation distribution, GPU-hours, memory headroom, energy, power.",
    ["cluster"],
    [
        [stat("GPUs installed", f"count({INSTALLED})"),
         stat("GPUs healthy", f"count({HEALTHY}) or vector(0)"),
         stat("GPUs allocated", f"count({ALLOCATED}) or vector(0)", description="GPUs a job is attributed to."),
         stat("GPUs idle", f"count({IDLE}) or vector(0)", description="Healthy GPUs no job is attributed to."),
         stat("Allocated share", f"(count({ALLOCATED}) or vector(0)) / count({INSTALLED})", "percentunit"),
         stat("Energy in range", f"sum(increase(gpufleet_gpu_energy_joules_total{{{CLUSTER}}}[$__range])) / 3.6e6",
              "kwatth")],
        [stat("GPU-hours installed", _gpu_hours(f"count({INSTALLED})"), "suffix: GPU-h", width=6),
         stat("GPU-hours allocated", _gpu_hours(f"count({ALLOCATED}) or vector(0)"), "suffix: GPU-h", width=6),
         stat("GPU-hours used", _gpu_hours(f"sum({UTILIZATION})"), "suffix: GPU-h", width=6,
              description="Allocated hours weighted by utilisation: what the jobs made of what they held."),
         stat("Share of GPU-hours below 10% utilisation",
              f"{_gpu_hours(f'count({UTILIZATION} < 0.1) or vector(0)')} / {_gpu_hours(f'count({UTILIZATION})')}",
              "percentunit", width=6, thresholds=(("green", None), ("orange", 0.2), ("red", 0.4)))],
        [table("GPUs by model", [
            (f"count by (name) ({INSTALLED})", "installed"),
            (f"count by (name) ({INSTALLED} and on ({_GPU_KEY}) {HEALTHY})", "healthy"),
            (f"count by (name) ({INSTALLED} and on ({_GPU_KEY}) {JOBS})", "allocated"),
            (f"count by (name) ({INSTALLED} and on ({_GPU_KEY}) ({IDLE}))", "idle"),
        ], width=12),
         timeseries("Allocated against idle", [
             (f"count({ALLOCATED}) or vector(0)", "allocated"),
             (f"count({IDLE}) or vector(0)", "idle"),
             (f"count(gpufleet_gpu_up{{{CLUSTER}}} == 0) or vector(0)", "lost"),
         ], "short", stacked=True)],
        [timeseries("Utilisation distribution", [
            (f"quantile({q}, {UTILIZATION})", f"p{round(q * 100)}") for q in (0.1, 0.5, 0.9)
        ] + [(f"avg({UTILIZATION})", "mean")], "percentunit", max_value=1,
            description="Quantiles over all GPUs at each instant."),
         timeseries("GPUs below 10% utilisation", [
             (f"count by (name) (({UTILIZATION} < 0.1) * on ({_GPU_KEY}) group_left (name) {INSTALLED})", "{{name}}")],
             "short")],
        [timeseries("Memory headroom", [
            (f"{_by_model('gpufleet_gpu_memory_free_bytes')} / {_by_model('gpufleet_gpu_memory_total_bytes')}",
             "{{name}}")], "percentunit", width=8, max_value=1, description="Free GPU memory as a share of total."),
         timeseries("Power against limit", [
             (f"{_by_model('gpufleet_gpu_power_watts')} / {_by_model('gpufleet_gpu_power_limit_watts')}",
              "{{name}}")], "percentunit", width=8, max_value=1),
         timeseries("Power", [(_by_model("gpufleet_gpu_power_watts"), "{{name}}")], "watt", width=8)],
    ],
    related=[("gpufleet-fleet", "Fleet overview")],
)
