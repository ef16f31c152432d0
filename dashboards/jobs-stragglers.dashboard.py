"""Jobs and stragglers: per job, each node's signals against the job's median, and its straggler score.

The panels read the series the straggler rules record, so what is drawn is what the alert
judged. Nodes with no job id (Kubernetes pods) are compared as busy nodes of one GPU model; they
appear with an empty job id and their model.
"""

from gpufleet.alerts.recording import JOB_XMIT_WAIT, JOB_XMIT_WAIT_MEDIAN, NODE_JOBS
from gpufleet.alerts.stragglers import CAUSE, MEDIAN, RELATIVE, SIGNAL, ZSCORE
from gpufleet.dashboards.panels import Sized, dashboard, table, timeseries

JOB = 'cluster=~"$cluster", job_id=~"$job_id"'
_NODE = "{{job_id}}{{model}} {{instance}}"
_GROUP = "{{job_id}}{{model}} median"


def _against_median(title: str, signal: str, unit: str, description: str) -> Sized:
    return timeseries(title, [
        (f'{SIGNAL}{{{JOB}, signal="{signal}"}}', _NODE),
        (f'{MEDIAN}{{{JOB}, signal="{signal}"}}', _GROUP),
    ], unit, description=description)


dashboard = dashboard(
    "gpufleet-jobs", "gpufleet / Jobs and stragglers",
    "Per job, every node's SM clock and power against the job's median, the straggler scores and their causes.",
    ["cluster", "job_id"],
    [
        [table("Jobs", [
            (f"count by (cluster, scheduler, job_id) ({NODE_JOBS}{{{JOB}}})", "nodes"),
            (f"sum by (cluster, scheduler, job_id) ({NODE_JOBS}{{{JOB}}})", "GPUs"),
        ], description="Jobs the schedulers placed on gpufleet nodes, with their size."),
         ],
        [_against_median("SM clock against the job median", "sm_clock", "hertz",
                         "A node whose line sits below its job's median computes slower than its peers."),
         _against_median("Power against the job median", "power", "watt",
                         "A straggler draws less power: its GPUs wait, or run at capped clocks.")],
        [timeseries("Share of the best node", [(f"{RELATIVE}{{{JOB}}}", _NODE + " {{signal}}")], "percentunit",
                    description="Each node's signal over its group's best node; the alert fires below 75% "
                                "together with a robust z-score below -3."),
         timeseries("Robust z-score", [(f"{ZSCORE}{{{JOB}}}", _NODE + " {{signal}}")], "short",
                    description="0.6745 (x - median) / MAD: how many spreads a node sits from its peers.")],
        [timeseries("InfiniBand wait per node against the job median", [
            (f"{JOB_XMIT_WAIT}{{{JOB}}}", "{{job_id}} {{instance}}"),
            (f"{JOB_XMIT_WAIT_MEDIAN}{{{JOB}}}", "{{job_id}} median"),
        ], "short", width=24, description="A node congested on its fabric ports waits more than its peers.")],
        [table("Stragglers", [(f'ALERTS{{alertname="NodeStraggler", alertstate="firing", {JOB}}}', "firing")],
               node_link=True, width=14, description="Nodes the NodeStraggler alert names now."),
         table("Likely causes on straggling nodes", [
             (f'{CAUSE}{{cluster=~"$cluster"}} and on (cluster, instance) '
              f'ALERTS{{alertname="NodeStraggler", alertstate="firing", {JOB}}}', "active")],
             node_link=True, width=10, description="Thermal slowdown, power brake, degraded PCIe or NIC congestion "
                                                   "on a node that straggles.")],
    ],
    related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-node", "Node detail")],
)
