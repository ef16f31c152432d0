"""Recording rules that alerts and dashboards share: per-node and per-job aggregates, link utilisation.

Aggregating once here keeps rule evaluation cheap at thousands of nodes: the alerts read a few
thousand recorded series instead of re-aggregating every per-GPU series on each evaluation.
Names follow `level:metric:operations`.
"""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import record

NODE_JOBS = "instance_job:gpufleet_gpu_job_info:count"
LINK_UTILIZATION = "instance_port:gpufleet_link_utilization:ratio_rate5m"
XMIT_WAIT = "instance_port:gpufleet_infiniband_xmit_wait:rate5m"
JOB_XMIT_WAIT = "job_instance:gpufleet_infiniband_xmit_wait:rate5m"
JOB_XMIT_WAIT_MEDIAN = "job:gpufleet_infiniband_xmit_wait:median_rate5m"


def _per_job(c: Config, node_level: str) -> str:
    """A per-node expression repeated for each job that has GPUs on the node, carrying the job's labels."""
    return f"{NODE_JOBS} * 0 + on ({c.by('instance')}) group_left {node_level}"


# Counter, link speed, the labels that name a port (besides the cluster), its class, and the direction.
_LINKS = (
    ("gpufleet_network_transmit_bytes_total", "gpufleet_network_speed_bytes_per_second", ("instance", "device"),
     "net", "transmit"),
    ("gpufleet_network_receive_bytes_total", "gpufleet_network_speed_bytes_per_second", ("instance", "device"),
     "net", "receive"),
    ("gpufleet_infiniband_port_xmit_data_bytes_total", "gpufleet_infiniband_rate_bytes_per_second",
     ("instance", "device", "port"), "infiniband", "transmit"),
    ("gpufleet_infiniband_port_rcv_data_bytes_total", "gpufleet_infiniband_rate_bytes_per_second",
     ("instance", "device", "port"), "infiniband", "receive"),
)


def link_utilization(c: Config, name: str, window: str, known_speed: bool = False) -> list[dict[str, Any]]:
    """Throughput as a share of link speed, one rule per link class and direction. `known_speed` leaves out
    links that report a speed of 0, rather than recording them as infinitely busy."""
    rules = []
    for counter, speed, port, class_, direction in _LINKS:
        divisor = f"({c.metric(speed)} > 0)" if known_speed else c.metric(speed)
        ratio = f"rate({c.metric(counter)}[{c.d(window)}]) / on ({c.by(*port)}) {divisor}"
        rules.append(record(name, ratio, direction=direction, **{"class": class_}))
    return rules


def shared(c: Config) -> dict[str, Any]:
    rules = [
        record(NODE_JOBS, f"count by ({c.by('instance', 'scheduler', 'job_id', 'namespace', 'pod')}) "
                          f"({c.metric('gpufleet_gpu_job_info')})"),
        record("instance:gpufleet_gpu_utilization_ratio:avg",
               f"avg by ({c.by('instance')}) ({c.metric('gpufleet_gpu_utilization_ratio')})"),
        record("instance:gpufleet_gpu_power_watts:sum",
               f"sum by ({c.by('instance')}) ({c.metric('gpufleet_gpu_power_watts')})"),
        record("instance:gpufleet_gpus_up:sum", f"sum by ({c.by('instance')}) ({c.metric('gpufleet_gpu_up')})"),
        *link_utilization(c, LINK_UTILIZATION, "5m"),
        record(XMIT_WAIT, f"rate({c.metric('gpufleet_infiniband_port_xmit_wait_total')}[{c.d('5m')}])"),
        record(JOB_XMIT_WAIT, _per_job(c, f"sum by ({c.by('instance')}) ({XMIT_WAIT})")),
        record(JOB_XMIT_WAIT_MEDIAN, f"quantile by ({c.by('scheduler', 'job_id')}) (0.5, {JOB_XMIT_WAIT})"),
    ]
    return {"name": "gpufleet-recording", "rules": rules}
