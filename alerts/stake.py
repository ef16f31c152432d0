"""What a page puts at stake: the jobs on the GPU or node it names, each with its size and the GPU-hours it has
run, in the page's `jobs_at_stake` annotation, which the runbooks read first.

An annotation, never a label: the jobs change while an alert fires, and a changed label would be a new alert
and a new page. It is rendered from the exporter's `gpufleet_gpu_job_info` of the last `STAKE_WINDOW`, so that
a node whose exporter went dark still names the jobs it was running; a node or GPU with none is said idle.
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import NODE_JOBS, STAKE_WINDOW

# Each job's GPUs, every minute: its GPU-hours are the sum of these samples over HOURS_WINDOW, in minutes.
JOB_GPUS = "job:gpufleet_gpu_job_info:count"
HOURS_WINDOW = "30d"


def job_gpus(c: Config) -> dict[str, Any]:
    """JOB_GPUS, for a group evaluated every TREND_INTERVAL."""
    return {"record": JOB_GPUS, "expr": f'sum by ({c.by("scheduler", "job_id")}) ({NODE_JOBS}{{job_id!=""}})'}


def _query(text: str, *arguments: str) -> str:
    """A Go-template `printf` of a query whose `%s` take `arguments`, in a raw string: PromQL's quotes stay."""
    return f"printf `{text}` {' '.join(arguments)}"


def at_stake(c: Config, interval: str) -> str:
    """The `jobs_at_stake` template, for an alert with `instance` (and `uuid` for one GPU); `interval` is the
    production evaluation interval of JOB_GPUS's group, which each of its samples stands for."""
    cluster = f"$labels.{c.cluster_label}"
    window = c.d(STAKE_WINDOW)
    info = c.metric("gpufleet_gpu_job_info", f'{c.cluster_label}="%s"', 'job_id="%s"')
    on_job = f"last_over_time({info}[{window}])"
    here = c.metric("gpufleet_gpu_job_info", f'{c.cluster_label}="%s"', 'instance="%s"', "%s", 'job_id!=""')
    jobs = _query(f"count by (scheduler, job_id) (last_over_time({here}[{window}]))", cluster, "$labels.instance",
                  "$gpu")
    nodes = _query(f"count(count by (instance) ({on_job}))", cluster, "$j.Labels.job_id")
    gpus = _query(f"count({on_job})", cluster, "$j.Labels.job_id")
    samples_an_hour = 3600 / duration.parse(interval)
    hours = _query(f'sum_over_time({JOB_GPUS}{{{c.cluster_label}="%s",scheduler="%s",job_id="%s"}}'
                   f"[{c.d(HOURS_WINDOW)}]) / {samples_an_hour:g}", cluster, "$j.Labels.scheduler", "$j.Labels.job_id")
    return ("{{ $gpu := `uuid!=\"\"` }}{{ $where := \"node\" }}{{ if $labels.uuid }}"
            "{{ $gpu = printf `uuid=\"%s\"` $labels.uuid }}{{ $where = \"GPU\" }}{{ end }}"
            f"{{{{ with {jobs} | query }}}}Jobs on this {{{{ $where }}}} in the last {STAKE_WINDOW}: "
            "{{ range $n, $j := . }}{{ if $n }}; {{ end }}{{ $j.Labels.scheduler }} job {{ $j.Labels.job_id }}"
            f"{{{{ with {nodes} | query }}}}{{{{ with first . }}}}, {{{{ .Value }}}} nodes{{{{ end }}}}{{{{ end }}}}"
            f"{{{{ with {gpus} | query }}}}{{{{ with first . }}}}, {{{{ .Value }}}} GPUs{{{{ end }}}}{{{{ end }}}}"
            f"{{{{ with {hours} | query }}}}{{{{ with first . }}}}, {{{{ printf \"%.0f\" .Value }}}} GPU-hours in "
            f"{HOURS_WINDOW}{{{{ end }}}}{{{{ end }}}}{{{{ end }}}}."
            f"{{{{ else }}}}No job ran on this {{{{ $where }}}} in the last {STAKE_WINDOW}: it is idle.{{{{ end }}}}")
