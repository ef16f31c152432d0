"""Capacity: what the fleet has, how much of it jobs hold, and how much of what they hold they use.

GPU-hours over the dashboard's range are sums of the capacity rules' counts, each evaluation's standing for
one interval, so a GPU that joined halfway through counts for half the range, not all of it.
"""

from grafanalib.core import Dashboard

from gpufleet import duration
from gpufleet.alerts import capacity as recorded
from gpufleet.alerts.config import Config
from gpufleet.dashboards.panels import Scope, dashboard, stat, table, timeseries


def _gpu_hours(config: Config, recorded_series: str) -> str:
    """GPU-hours over the range from a capacity rule's counts (or sums of shares): each evaluation's sample
    stands for one interval. Counting every GPU at each of an hour's points instead costs a thousand-node
    Prometheus seconds, and a subquery stepped at the rules' interval finds no step in a short range."""
    return (f"sum(sum_over_time({recorded_series}[$__range])) * "
            f"{duration.parse(config.d(recorded.INTERVAL)):g} / 3600")


def build(config: Config) -> Dashboard:
    s = Scope(config)
    gpu_key = s.by("instance", "gpu")
    installed = f"gpufleet_gpu_info{{{s.cluster}}}"
    healthy = f"gpufleet_gpu_up{{{s.cluster}}} == 1"
    jobs = f"gpufleet_gpu_job_info{{{s.cluster}}}"
    allocated = f"count by ({gpu_key}) ({jobs})"
    idle = f"{healthy} unless on ({gpu_key}) {jobs}"
    utilization = f"gpufleet_gpu_utilization_ratio{{{s.cluster}}}"

    buckets = f"{recorded.ALLOCATED_BUCKETS}{{{s.recorded}}}"
    below_tenth = f'{recorded.ALLOCATED_BUCKETS}{{{s.recorded}, bucket=~"0|0.05"}}'  # Buckets are 5 % wide.

    def gpu_states(state: str) -> str:
        return f'{recorded.GPUS}{{{s.recorded}, state="{state}"}}'

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
            [stat("GPU-hours installed", _gpu_hours(config, gpu_states("installed")) + " or vector(0)",
                  "suffix: GPU-h", width=6,
                  description="From the capacity rules (every 5m)."),
             stat("GPU-hours allocated", _gpu_hours(config, gpu_states("allocated")) + " or vector(0)",
                  "suffix: GPU-h", width=6,
                  description="Healthy GPUs a job is attributed to, from the capacity rules (every 5m)."),
             stat("GPU-hours used", _gpu_hours(config, f"{recorded.USED}{{{s.recorded}}}"),
                  "suffix: GPU-h", width=6,
                  description="GPU-hours weighted by utilisation, from the capacity rules (every 5m): what the jobs "
                              "made of what they held."),
             stat("Share of allocated GPU-hours below 10% utilisation",
                  f"({_gpu_hours(config, below_tenth)} or vector(0)) / "
                  f"{_gpu_hours(config, buckets)}",
                  "percentunit", width=6, thresholds=(("green", None), ("orange", 0.2), ("red", 0.4)),
                  description="Hours jobs held GPUs they barely used, from the capacity rules' utilisation buckets "
                              "(every 5m).")],
            [table("GPUs by model", [
                (f"count by (name) ({installed})", "installed"),
                (f"count by (name) ({installed} and on ({gpu_key}) {healthy})", "healthy"),
                (f"count by (name) ({installed} and on ({gpu_key}) {jobs})", "allocated"),
                (f"count by (name) ({installed} and on ({gpu_key}) ({idle}))", "idle"),
            ], width=12),
             timeseries("Allocated against idle", [
                 (f"sum({gpu_states(state)}) or vector(0)", state) for state in ("allocated", "idle", "lost")
             ], "short", stacked=True,
                 description="From the capacity rules (every 5m): counting every GPU at each point of an hour "
                             "costs a thousand-node Prometheus seconds.")],
            [timeseries("Utilisation distribution", [
                (f"quantile({q}, {utilization})", f"p{round(q * 100)}") for q in (0.1, 0.5, 0.9)
            ] + [(f"avg({utilization})", "mean")], "percentunit", max_value=1, min_step="1m",
                description="Quantiles over all GPUs, at most one point a minute: each point sorts every GPU's "
                            "utilisation, and a capacity view gains nothing from more."),
             timeseries("Allocated GPUs below 10% utilisation", [
                 (f"sum by (name) ({below_tenth}) or 0 * sum by (name) ({buckets})", "{{name}}")], "short",
                 description="From the capacity rules' utilisation buckets (every 5m): GPUs jobs hold and barely use. "
                             "Idle GPUs are on the graph beside.")],
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
