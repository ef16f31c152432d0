"""Jobs and stragglers: per job, each node's signals against the job's median, and its straggler score.

The panels read the series the straggler rules record, so what is drawn is what the alert
judged. Nodes with no job id (Kubernetes pods) are compared as busy nodes of one GPU model; they
appear with an empty job id and their model.
"""

from grafanalib.core import Dashboard

from gpufleet.alerts import capacity
from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import JOB_XMIT_WAIT, JOB_XMIT_WAIT_MEDIAN, NODE_JOBS, TENSOR_ACTIVE
from gpufleet.alerts.stragglers import CAUSE, MEDIAN, RELATIVE, SIGNAL, ZSCORE
from gpufleet.dashboards.panels import Scope, Sized, dashboard, table, timeseries
from gpufleet.duration import spoken

_NODE = "{{job_id}}{{model}} {{instance}}"
_GROUP = "{{job_id}}{{model}} median"


def build(config: Config) -> Dashboard:
    s = Scope(config)
    job = f'{s.recorded}, job_id=~"$job_id"'
    straggling = f'ALERTS{{alertname="NodeStraggler", alertstate="firing", {job}}}'

    def against_median(title: str, signal: str, unit: str, description: str) -> Sized:
        return timeseries(title, [
            (f'{SIGNAL}{{{job}, signal="{signal}"}}', _NODE),
            (f'{MEDIAN}{{{job}, signal="{signal}"}}', _GROUP),
        ], unit, width=8, description=description)

    return dashboard(
        s, "gpufleet-jobs", "gpufleet / Jobs and stragglers",
        "Per job, every node's SM clock, power and utilisation against the job's median, the straggler scores and "
        "their causes.",
        ["cluster", "job_id"],
        [
            [table("Jobs", [
                (f"count by ({s.by('scheduler', 'job_id')}) ({NODE_JOBS}{{{job}}})", "nodes"),
                (f"sum by ({s.by('scheduler', 'job_id')}) ({NODE_JOBS}{{{job}}})", "GPUs"),
            ], description="Jobs the schedulers placed on gpufleet nodes, with their size."),
             ],
            [against_median("SM clock against the job median", "sm_clock", "hertz",
                            "A node whose line sits below its job's median computes slower than its peers."),
             against_median("Power against the job median", "power", "watt",
                            "A straggler draws less power: its GPUs wait, or run at capped clocks."),
             against_median("Utilisation against the job median", "utilization", "percentunit",
                            "A node whose GPUs idle between steps (waiting on their host or a slow PCIe link) sits "
                            "below its peers, which spin busy while they wait for it.")],
            [timeseries("Share of the median node", [(f"{RELATIVE}{{{job}}}", _NODE + " {{signal}}")], "percentunit",
                        description=f"Each node's signal over its group's median node; the alert fires below "
                                    f"{config.straggler_relative:.0%} of a job's median node "
                                    f"({config.straggler_relative_model:.0%} among nodes compared by GPU model) "
                                    f"together with a robust z-score below {config.straggler_zscore:g}."),
             timeseries("Robust z-score", [(f"{ZSCORE}{{{job}}}", _NODE + " {{signal}}")], "short",
                        description="0.6745 (x - median) / MAD: how many spreads a node sits from its peers.")],
            [timeseries("Busy and doing math per job", [
                (f"{capacity.JOB_USED}{{{job}}} / {capacity.JOB_GPUS}{{{job}}}", "{{job_id}} busy (NVML)"),
                (f"{capacity.JOB_TENSOR_ACTIVE}{{{job}}} / {capacity.JOB_GPM_GPUS}{{{job}}}", "{{job_id}} tensor"),
            ], "percentunit", max_value=1,
                description="Per job, the mean of its GPUs' NVML utilisation (a kernel ran) and of their tensor "
                            "activity (GPM, over the GPUs whose boards have it), from the capacity rules (every "
                            f"{spoken(capacity.INTERVAL)}). A job that waits on the network, or on one slow node, "
                            "stays busy and does less math."),
             timeseries("Tensor activity per node", [
                 # A node may hold several jobs (pods): the jobs are the many side.
                 (f"group by ({s.by('instance', 'job_id')}) ({NODE_JOBS}{{{job}}}) * on ({s.by('instance')}) "
                  f"group_left {TENSOR_ACTIVE}{{{s.recorded}}}", "{{job_id}} {{instance}}"),
             ], "percentunit", max_value=1,
                description="A straggler's peers wait for it busy but doing no math: their tensor activity falls "
                            "below the straggler's.")],
            [timeseries("InfiniBand wait per node against the job median", [
                (f"{JOB_XMIT_WAIT}{{{job}}}", "{{job_id}} {{instance}}"),
                (f"{JOB_XMIT_WAIT_MEDIAN}{{{job}}}", "{{job_id}} median"),
            ], "short", width=24, description="A node congested on its fabric ports waits more than its peers.")],
            [table("Stragglers", [(straggling, "firing")],
                   node_link=s, width=14, description="Nodes the NodeStraggler alert names now."),
             table("Likely causes on straggling nodes", [
                 (f"{CAUSE}{{{s.recorded}}} and on ({s.by('instance')}) {straggling}", "active")],
                 node_link=s, width=10, description="Thermal slowdown, power brake, degraded PCIe, NIC congestion or "
                                                    "GPUs idle between steps on a node that straggles.")],
        ],
        related=[("gpufleet-fleet", "Fleet overview"), ("gpufleet-node", "Node detail")],
    )
