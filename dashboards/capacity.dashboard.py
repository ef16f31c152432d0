"""Capacity: what the fleet has, how much of it jobs hold, and how much of what they hold they use.

GPU-hours over the dashboard's range are sums of per-interval counts (a subquery at the panel's
interval), so a GPU that joined halfway through counts for half the range, not all of it.
"""

from grafanalib.core import Dashboard

from gpufleet.alerts import capacity as recorded
from gpufleet.alerts.config import Config
from gpufleet.dashboards.panels import Scope, dashboard, stat, table, timeseries

_HOURS = "* $__interval_ms / 3600000"


def _gpu_hours(per_instant: str) -> str:
    """GPU-hours over the range from an expression that counts GPUs (or sums shares of GPUs) at an instant."""
    return f"sum_over_time(({per_instant})[$__range:$__interval]) {_HOURS}"


def build(config: Config) -> Dashboard:
    s = Scope(config)
    gpu_key = s.by("instance", "gpu")
    installed = f"gpufleet_gpu_info{{{s.cluster}}}"
    healthy = f"gpufleet_gpu_up{{{s.cluster}}} == 1"
    jobs = f"gpufleet_gpu_job_info{{{s.cluster}}}"
    allocated = f"count by ({gpu_key}) ({jobs})"
    idle = f"{healthy} unless on ({gpu_key}) {jobs}"
    utilization = f"gpufleet_gpu_utilization_ratio{{{s.cluster}}}"

    return dashboard(
        s, "gpufleet-capacity", "gpufleet / Capacity",
        "GPUs by model, allocated against idle, utilisation distribution, GPU-hours, memory headroom, energy, power.",
        ["cluster"],
        [
            [stat("GPUs installed", f"count({installed})"),
             stat("GPUs healthy", f"count({healthy}) or vector(0)"),
             stat("GPUs allocated", f"count({allocated}) or vector(0)", description="GPUs a job is attributed to."),
             stat("GPUs idle", f"count({idle}) or vector(0)", description="Healthy GPUs no job is attributed to."),
             stat("Allocated share", f"(count({allocated}) or vector(0)) / count({installed})", "percentunit"),
             stat("Energy in range",
                  f"sum(increase(gpufleet_gpu_energy_joules_total{{{s.cluster}}}[$__range])) / 3.6e6", "kwatth")],
            [stat("GPU-hours installed", _gpu_hours(f"count({installed})"), "suffix: GPU-h", width=6),
             stat("GPU-hours allocated", _gpu_hours(f"count({allocated}) or vector(0)"), "suffix: GPU-h", width=6),
             stat("GPU-hours used", _gpu_hours(f"sum({utilization})"), "suffix: GPU-h", width=6,
                  description="Allocated hours weighted by utilisation: what the jobs made of what they held."),
             stat("Share of GPU-hours below 10% utilisation",
                  f"{_gpu_hours(f'count({utilization} < 0.1) or vector(0)')} / {_gpu_hours(f'count({utilization})')}",
                  "percentunit", width=6, thresholds=(("green", None), ("orange", 0.2), ("red", 0.4)))],
            [table("GPUs by model", [
                (f"count by (name) ({installed})", "installed"),
                (f"count by (name) ({installed} and on ({gpu_key}) {healthy})", "healthy"),
                (f"count by (name) ({installed} and on ({gpu_key}) {jobs})", "allocated"),
                (f"count by (name) ({installed} and on ({gpu_key}) ({idle}))", "idle"),
            ], width=12),
             timeseries("Allocated against idle", [
                 (f'sum({recorded.GPUS}{{{s.recorded}, state="{state}"}}) or vector(0)', state)
                 for state in ("allocated", "idle", "lost")
             ], "short", stacked=True,
                 description="From the capacity rules (every 5m): counting every GPU at each point of an hour "
                             "costs a thousand-node Prometheus seconds.")],
            [timeseries("Utilisation distribution", [
                (f"quantile({q}, {utilization})", f"p{round(q * 100)}") for q in (0.1, 0.5, 0.9)
            ] + [(f"avg({utilization})", "mean")], "percentunit", max_value=1,
                description="Quantiles over all GPUs at each instant."),
             timeseries("GPUs below 10% utilisation", [
                 (f"count by (name) (({utilization} < 0.1) * on ({gpu_key}) group_left (name) {installed})",
                  "{{name}}")],
                 "short")],
            [timeseries("Memory headroom of allocated GPUs", [
                (f"sum by (name) ({recorded.MEMORY_FREE}{{{s.recorded}}}) / "
                 f"sum by (name) ({recorded.MEMORY_TOTAL}{{{s.recorded}}})", "{{name}}")],
                "percentunit", width=8, max_value=1,
                description="Free memory of the GPUs jobs hold, as a share of their total, from the capacity rules "
                            "(every 5m): what a denser packing of jobs could still use."),
             timeseries("Power against limit", [
                 (f"sum by (name) ({recorded.POWER_OF_LIMIT}{{{s.recorded}}}) / "
                  f"sum by (name) ({recorded.POWER_GPUS}{{{s.recorded}}})", "{{name}}")],
                 "percentunit", width=8, max_value=1,
                 description="The GPUs' mean power as a share of each one's limit, from the capacity rules "
                             "(every 5m)."),
             timeseries("Power", [(f"sum by (name) ({recorded.POWER}{{{s.recorded}}})", "{{name}}")], "watt",
                        width=8, description="Board power of the GPUs, from the capacity rules (every 5m).")],
        ],
        related=[("gpufleet-fleet", "Fleet overview")],
    )
