"""Recording rules for the capacity report: the fleet's month, kept small enough to read in seconds.

A 30-day report over raw per-GPU series scraped every 15 s would decode billions of samples
(8,000 GPUs x 172,800 scrapes a series). These rules evaluate every `INTERVAL` and keep three kinds
of series, so the report's cost follows clusters, jobs and links, not GPUs times scrapes:

- per cluster and GPU model (`cluster_name:`): GPU counts by state, utilisation sums and buckets,
  memory, power and energy; nodes, and the power of those with their own meter; and, for allocated
  GPUs that have GPM, what they did beside what NVML calls busy;
- per job (`cluster_job:`) and per link (`instance_port:`): what the top-jobs and busiest-links
  tables rank;
- per GPU, node or port, only while something is wrong: ECC errors, row remaps, lost GPUs, GPUs
  missing from NVML, straggling nodes, InfiniBand ports with errors. Healthy hardware writes nothing
  here. The fabric dashboard draws the ports' error rates from here too: at All, rating every
  port's seven error counters at each refresh would cost Prometheus seconds.

Every per-GPU series carries the GPU's model (`name`), so the report never joins over the range.
The report's step must not be finer than `INTERVAL`, or its points would miss samples.

The rules are cut into groups, one per kind of figure. Prometheus starts each group at its own
offset within the interval (a hash of its name), so their work is spread over the five minutes: as one
group, at 1,000 nodes, it took 14 s in one block, and every 15 s group evaluated in that block waited for
a CPU. A series whose absence means good news (a GPU's errors, a straggling node) is in the group of the
series the report checks for first, so that "none" is said only when that group is loaded.
"""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.recording import link_utilization
from gpufleet.alerts.rule import record

INTERVAL = "5m"  # Scaled with the windows (`Config.d`), so that a time-scaled test still sees two per window.
WINDOW = "10m"  # Rates and averages span two evaluations, so a late one leaves no gap.
BUCKETS = 20  # Utilisation buckets 5% wide: quantiles are exact to 5%.
TIGHT_MEMORY = 0.1  # Free memory share under which an allocated GPU counts as memory-bound.
CAPPED_POWER = 0.95  # Share of the enforced power limit at which a GPU is likely being capped.
GROUP = "gpufleet-capacity-{}"

GPUS = "cluster_name:gpufleet_gpus:count"  # Label `state`: installed, allocated, idle or lost.
USED = "cluster_name:gpufleet_gpu_utilization_ratio:sum"
ALLOCATED_USED = "cluster_name:gpufleet_allocated_gpu_utilization_ratio:sum"
ALLOCATED_BUCKETS = "cluster_name_bucket:gpufleet_allocated_gpu_utilization_ratio:count"
MEMORY_FREE = "cluster_name:gpufleet_allocated_gpu_memory_free_bytes:sum"
MEMORY_TOTAL = "cluster_name:gpufleet_allocated_gpu_memory_total_bytes:sum"
MEMORY_TIGHT = "cluster_name:gpufleet_allocated_gpus_memory_tight:count"
MEMORY_LOWEST = "cluster_name:gpufleet_allocated_gpu_memory_free:min_ratio"
ENERGY = "cluster_name:gpufleet_gpu_energy_joules:sum_rate10m"
POWER = "cluster_name:gpufleet_gpu_power_watts:sum"
POWER_GPUS = "cluster_name:gpufleet_gpu_power_watts:count"
POWER_OF_LIMIT = "cluster_name:gpufleet_gpu_power_limit:sum_ratio"
POWER_CAPPED = "cluster_name:gpufleet_gpus_power_capped:count"
NODES = "cluster_name:gpufleet_nodes:count"
METERED_NODES = "cluster_name:gpufleet_node_power_watts:count"
NODE_POWER = "cluster_name:gpufleet_node_power_watts:sum"
METERED_GPU_POWER = "cluster_name:gpufleet_metered_node_gpu_power_watts:sum"
ECC = "instance_gpu:gpufleet_gpu_ecc_uncorrected_errors:total"
REMAP_PENDING = "instance_gpu:gpufleet_gpu_row_remap_pending:true"
REMAP_FAILED = "instance_gpu:gpufleet_gpu_row_remap_failed:true"
LOST = "instance_gpu:gpufleet_gpu_lost:true"
PCI_MISSING = "instance:gpufleet_gpus_missing_from_nvml:count"
STRAGGLING = "job_instance:gpufleet_gpu_sm_clock:ratio_to_median_straggling"
JOB_GPUS = "cluster_job:gpufleet_gpus:count"
JOB_NODES = "cluster_job:gpufleet_nodes:count"
JOB_USED = "cluster_job:gpufleet_gpu_utilization_ratio:sum"
# "Busy" beside "doing math", over the allocated GPUs whose board has GPM (Hopper and newer): their count, the
# sums of their NVML utilisation, SM activity and tensor activity. A GPU without GPM is in none of them, so its
# hours are left out rather than counted as no work. Per job, the same over the job's GPUs that have GPM.
GPM_GPUS = "cluster_name:gpufleet_allocated_gpm_gpus:count"
GPM_USED = "cluster_name:gpufleet_allocated_gpm_gpu_utilization_ratio:sum"
SM_ACTIVE = "cluster_name:gpufleet_allocated_gpu_sm_active_ratio:sum"
TENSOR_ACTIVE = "cluster_name:gpufleet_allocated_gpu_tensor_active_ratio:sum"
JOB_GPM_GPUS = "cluster_job:gpufleet_gpm_gpus:count"
JOB_SM_ACTIVE = "cluster_job:gpufleet_gpu_sm_active_ratio:sum"
JOB_TENSOR_ACTIVE = "cluster_job:gpufleet_gpu_tensor_active_ratio:sum"
LINKS = "instance_port:gpufleet_link_utilization:ratio_rate10m"
IB_ERRORS = "instance_port:gpufleet_infiniband_errors:rate10m"  # All error counters' rates together.
IB_ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "link_error_recovery", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors", "vl15_dropped")

# Besides the cluster label: the labels that name a GPU, and a job.
GPU = ("instance", "gpu")
JOB = ("scheduler", "job_id", "namespace", "pod")


def capacity(c: Config) -> list[dict[str, Any]]:
    m = c.metric
    gpu, job, by_model_labels = c.by(*GPU), c.by(*JOB), c.by("name")
    ecc = m("gpufleet_gpu_ecc_errors_total", 'error="uncorrected"', 'scope="aggregate"')
    info = f"max by ({gpu}, name) ({m('gpufleet_gpu_info')})"
    allocated = f"group by ({gpu}) ({m('gpufleet_gpu_job_info')})"
    healthy = f"({info} and on ({gpu}) ({m('gpufleet_gpu_up')} == 1))"
    util = m("gpufleet_gpu_utilization_ratio")
    held_util = f"{util} * on ({gpu}) group_left (name) ({info} and on ({gpu}) {allocated})"
    free_share = f"({m('gpufleet_gpu_memory_free_bytes')} / {m('gpufleet_gpu_memory_total_bytes')})"

    def by_model(per_gpu: str) -> str:
        return f"sum by ({by_model_labels}) (({per_gpu}) * on ({gpu}) group_left (name) {info})"

    def allocated_only(per_gpu: str) -> str:
        return f"{per_gpu} and on ({gpu}) {allocated}"

    def named(per_gpu: str) -> str:
        return f"({per_gpu}) * on ({gpu}) group_left (name) {info}"

    power_ratio = f"({m('gpufleet_gpu_power_watts')} / {m('gpufleet_gpu_power_limit_watts')})"
    # A node's own power meter (ACPI power_meter) counts what the boards' counters leave out: CPUs, NICs,
    # fans. Nodes are filed under their GPUs' model; a node without a meter is counted, never read as 0 W.
    node, node_model = c.by("instance"), f"group by ({c.by('instance')}, name) ({m('gpufleet_gpu_info')})"
    meter = f"sum by ({node}) ({c.power_meter()})"
    metered = f"{meter} * on ({node}) group_left (name) {node_model}"
    job_key = c.by("scheduler", "job_id")
    # From the raw series, not the first tier's: this group must also be computable alone, over the past
    # (`promtool tsdb create-blocks-from rules`), and at one evaluation in 5 minutes it costs little.
    named_jobs = m("gpufleet_gpu_job_info", 'job_id!=""')
    sm_active, tensor = m("gpufleet_gpu_sm_active_ratio"), m("gpufleet_gpu_tensor_active_ratio")
    held_gpm_util = f"{allocated_only(util)} and on ({gpu}) group by ({gpu}) ({tensor})"


    def per_job(per_gpu: str) -> str:
        return f"sum by ({job}) ({m('gpufleet_gpu_job_info')} * on ({gpu}, uuid) group_left {per_gpu})"

    raw_clock = m("gpufleet_gpu_clock_hertz", 'clock="sm"')
    sm_clock = f"avg_over_time({raw_clock}[{c.d(WINDOW)}])"
    clock = (f"avg by ({c.by('scheduler', 'job_id', 'instance')}) ({named_jobs}"
             f" * on ({c.by('instance', 'gpu', 'uuid')}) group_left {sm_clock})")
    # Against the job's median node, as NodeStraggler judges: a job of one node is its own median (ratio 1), so
    # it never straggles, and no count of peers is needed.
    relative = f"{clock} / on ({job_key}) group_left quantile by ({job_key}) (0.5, {clock})"

    def group(part: str, *rules: dict[str, Any]) -> dict[str, Any]:
        return {"name": GROUP.format(part), "interval": c.d(INTERVAL), "rules": list(rules)}

    return [
        group("gpus",
              record(GPUS, f"count by ({by_model_labels}) ({info})", state="installed"),
              record(GPUS, f"count by ({by_model_labels}) ({healthy} and on ({gpu}) {allocated})", state="allocated"),
              record(GPUS, f"count by ({by_model_labels}) ({healthy} unless on ({gpu}) {allocated})", state="idle"),
              record(GPUS, f"count by ({by_model_labels}) ({info} and on ({gpu}) ({m('gpufleet_gpu_up')} == 0))",
                     state="lost"),
              record(ECC, named(f"sum by ({gpu}) ({ecc}) > 0")),
              record(REMAP_PENDING, named(f"max by ({gpu}) ({m('gpufleet_gpu_row_remap_pending')}) == 1")),
              record(REMAP_FAILED, named(f"max by ({gpu}) ({m('gpufleet_gpu_row_remap_failed')}) == 1")),
              record(LOST, f"{info} and on ({gpu}) ({m('gpufleet_gpu_up')} == 0)"),
              record(PCI_MISSING, f"({m('gpufleet_gpu_pci_devices')} - {m('gpufleet_gpu_devices')}) > 0")),
        group("usage",
              record(USED, by_model(util)),
              record(ALLOCATED_USED, f"sum by ({by_model_labels}) ({held_util})"),
              record(ALLOCATED_BUCKETS, f'count_values by ({by_model_labels}) ("bucket", '
                                        f"floor({BUCKETS} * ({held_util})) / {BUCKETS})"),
              record(GPM_GPUS, f"count by ({by_model_labels}) ({named(allocated_only(tensor))})"),
              record(GPM_USED, by_model(held_gpm_util)),
              record(SM_ACTIVE, by_model(allocated_only(sm_active))),
              record(TENSOR_ACTIVE, by_model(allocated_only(tensor)))),
        group("memory",
              record(MEMORY_FREE, by_model(allocated_only(m("gpufleet_gpu_memory_free_bytes")))),
              record(MEMORY_TOTAL, by_model(allocated_only(m("gpufleet_gpu_memory_total_bytes")))),
              record(MEMORY_TIGHT, f"count by ({by_model_labels}) "
                                   f"({named(allocated_only(free_share))} < {TIGHT_MEMORY:g})"),
              record(MEMORY_LOWEST, f"min by ({by_model_labels}) ({named(allocated_only(free_share))})")),
        group("power",
              record(ENERGY, by_model(f"rate({m('gpufleet_gpu_energy_joules_total')}[{c.d(WINDOW)}])")),
              record(POWER, by_model(m("gpufleet_gpu_power_watts"))),
              record(POWER_GPUS, f"count by ({by_model_labels}) ({named(m('gpufleet_gpu_power_watts'))})"),
              record(POWER_OF_LIMIT, by_model(power_ratio)),
              record(POWER_CAPPED, f"count by ({by_model_labels}) ({named(power_ratio)} >= {CAPPED_POWER:g})"),
              record(NODES, f"count by ({by_model_labels}) ({node_model})"),
              record(METERED_NODES, f"count by ({by_model_labels}) ({metered})"),
              record(NODE_POWER, f"sum by ({by_model_labels}) ({metered})"),
              record(METERED_GPU_POWER, by_model(f"{m('gpufleet_gpu_power_watts')} and on ({node}) {meter}"))),
        group("jobs",
              record(JOB_GPUS, f"count by ({job}) ({m('gpufleet_gpu_job_info')})"),
              record(JOB_NODES, f"count by ({job}) (group by ({job}, instance) ({m('gpufleet_gpu_job_info')}))"),
              record(JOB_USED, per_job(util)),
              record(JOB_GPM_GPUS, f"count by ({job}) ({m('gpufleet_gpu_job_info')} and on ({gpu}, uuid) {tensor})"),
              record(JOB_SM_ACTIVE, per_job(sm_active)),
              record(JOB_TENSOR_ACTIVE, per_job(tensor)),
              record(STRAGGLING, f"({relative}) < {c.straggler_relative:g}")),
        group("links",
              *link_utilization(c, LINKS, WINDOW, known_speed=True),
              record(IB_ERRORS, "(" + " + ".join(f"rate({m(f'gpufleet_infiniband_{counter}_total')}[{c.d(WINDOW)}])"
                                                 for counter in IB_ERROR_COUNTERS) + ") > 0")),
    ]
