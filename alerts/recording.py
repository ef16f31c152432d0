"""Recording rules that alerts and dashboards share: per-node and per-job aggregates, link utilisation.

Aggregating once here keeps rule evaluation cheap at thousands of nodes: the alerts read a few
thousand recorded series instead of re-aggregating every per-GPU series on each evaluation.
Names follow `level:metric:operations`.
"""

from __future__ import annotations

from typing import Any

from alerts.config import Config
from alerts.rule import record

NODE_JOBS = "instance_job:gpufleet_gpu_job_info:count"
LINK_UTILIZATION = "instance_port:gpufleet_link_utilization:ratio_rate5m"
XMIT_WAIT = "instance_port:gpufleet_infiniband_xmit_wait:rate5m"
JOB_XMIT_WAIT = "job_instance:gpufleet_infiniband_xmit_wait:rate5m"
JOB_XMIT_WAIT_MEDIAN = "job:gpufleet_infiniband_xmit_wait:median_rate5m"


def _per_job(node_level: str) -> str:
    """A per-node expression repeated for each job that has GPUs on the node, carrying the job's labels."""
    return f"{NODE_JOBS} * 0 + on (cluster, instance) group_left {node_level}"


def _utilization(c: Config, counter: str, speed: str, match: str, class_: str, direction: str) -> dict[str, Any]:
    ratio = f"rate({c.metric(counter)}[{c.d('5m')}]) / on ({match}) {c.metric(speed)}"
    return record(LINK_UTILIZATION, ratio, direction=direction, **{"class": class_})


def shared(c: Config) -> dict[str, Any]:
    ethernet = ("gpufleet_network_speed_bytes_per_second", "cluster, instance, device", "net")
    infiniband = ("gpufleet_infiniband_rate_bytes_per_second", "cluster, instance, device, port", "infiniband")
    rules = [
        record(NODE_JOBS, f"count by (cluster, instance, scheduler, job_id, namespace, pod) "
                          f"({c.metric('gpufleet_gpu_job_info')})"),
        record("instance:gpufleet_gpu_utilization_ratio:avg",
               f"avg by (cluster, instance) ({c.metric('gpufleet_gpu_utilization_ratio')})"),
        record("instance:gpufleet_gpu_power_watts:sum",
               f"sum by (cluster, instance) ({c.metric('gpufleet_gpu_power_watts')})"),
        record("instance:gpufleet_gpus_up:sum", f"sum by (cluster, instance) ({c.metric('gpufleet_gpu_up')})"),
        _utilization(c, "gpufleet_network_transmit_bytes_total", *ethernet, "transmit"),
        _utilization(c, "gpufleet_network_receive_bytes_total", *ethernet, "receive"),
        _utilization(c, "gpufleet_infiniband_port_xmit_data_bytes_total", *infiniband, "transmit"),
        _utilization(c, "gpufleet_infiniband_port_rcv_data_bytes_total", *infiniband, "receive"),
        record(XMIT_WAIT, f"rate({c.metric('gpufleet_infiniband_port_xmit_wait_total')}[{c.d('5m')}])"),
        record(JOB_XMIT_WAIT, _per_job(f"sum by (cluster, instance) ({XMIT_WAIT})")),
        record(JOB_XMIT_WAIT_MEDIAN, f"quantile by (cluster, scheduler, job_id) (0.5, {JOB_XMIT_WAIT})"),
    ]
    return {"name": "gpufleet-recording", "rules": rules}
