"""The dcgm-exporter compatibility layer: dcgm-exporter's default metric set, recorded from gpufleet's series
under dcgm-exporter's names, units and labels, so that the dashboards, rules and alerts a site wrote for
dcgm-exporter read gpufleet's data without a change.

Opt-in and in a file of its own (`gpufleet-dcgm-rules.yml`): it costs a rule evaluation per field at every
interval, and a site that has moved its own queries to gpufleet's names drops the file. The names and units
are those of dcgm-exporter's `etc/default-counters.csv`, the set NVIDIA's published dashboard reads; what
cannot be supplied is listed in `UNSUPPORTED`, with the reason, and in docs/exporter/dcgm-exporter.md.

Each field keeps gpufleet's labels (`gpu`, `uuid`, the target's) and gains dcgm-exporter's: `UUID`,
`modelName`, `device` (`nvidia0`), `pci_bus_id`, `DCGM_FI_DRIVER_VERSION` and `Hostname`, and, on a GPU that
runs a job, `pod`, `namespace` and `container` (Kubernetes) or `hpc_job` (Slurm, or a job-mapping directory) as
dcgm-exporter's job mapping sets them.
"""

from __future__ import annotations

import string
from typing import Any, NamedTuple

from gpufleet import xid
from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import record

LABELS = "gpu:gpufleet_dcgm_labels:info"
INFO = "gpu:gpufleet_dcgm_info:info"  # LABELS without the job's, recorded first so that LABELS reads it twice cheaply.
XID_LATEST = "gpu:gpufleet_xid_latest:timestamp"
# dcgm-exporter's labels that the layer adds to every field, from LABELS: the GPU's, and those of its job.
GPU_LABELS = ("UUID", "modelName", "device", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "Hostname")
JOB_LABELS = ("pod", "namespace", "container", "hpc_job")
DCGM_LABELS = GPU_LABELS + JOB_LABELS
MIB = 1024 * 1024
FIELDS_INTERVAL = "30s"  # dcgm-exporter's own default collection interval.
LABELS_INTERVAL = "1m"

class Field(NamedTuple):
    """One of dcgm-exporter's fields: its name, its unit there, and gpufleet's series converted to that unit."""

    name: str
    unit: str
    template: str  # PromQL, with each series named in braces (a name of `_SELECTED`, or the series itself).


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "MHz", "max without (clock) ({sm_clock}) / 1e6"),
    Field("DCGM_FI_DEV_MEM_CLOCK", "MHz", "max without (clock) ({memory_clock}) / 1e6"),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "°C", "{gpufleet_gpu_memory_temperature_celsius}"),
    Field("DCGM_FI_DEV_GPU_TEMP", "°C", "{gpufleet_gpu_temperature_celsius}"),
    Field("DCGM_FI_DEV_POWER_USAGE", "W", "{gpufleet_gpu_power_watts}"),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ (counter)", "{gpufleet_gpu_energy_joules_total} * 1000"),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "retries (counter)", "{gpufleet_gpu_pcie_replays_total}"),
    Field("DCGM_FI_DEV_GPU_UTIL", "%", "{gpufleet_gpu_utilization_ratio} * 100"),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "%", "{gpufleet_gpu_memory_copy_utilization_ratio} * 100"),
    Field("DCGM_FI_DEV_ENC_UTIL", "%", "{gpufleet_gpu_encoder_utilization_ratio} * 100"),
    Field("DCGM_FI_DEV_DEC_UTIL", "%", "{gpufleet_gpu_decoder_utilization_ratio} * 100"),
    Field("DCGM_FI_DEV_FB_FREE", "MiB", f"{{gpufleet_gpu_memory_free_bytes}} / {MIB}"),
    Field("DCGM_FI_DEV_FB_USED", "MiB", f"{{gpufleet_gpu_memory_used_bytes}} / {MIB}"),
    Field("DCGM_FI_DEV_FB_RESERVED", "MiB", f"{{gpufleet_gpu_memory_reserved_bytes}} / {MIB}"),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "rows", "max without (cause) ({uncorrectable_rows})"),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "rows", "max without (cause) ({correctable_rows})"),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0 or 1", "{gpufleet_gpu_row_remap_failed}"),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "ratio", "{gpufleet_gpu_graphics_active_ratio}"),
    Field("DCGM_FI_PROF_SM_ACTIVE", "ratio", "{gpufleet_gpu_sm_active_ratio}"),
    # dcgm-exporter's is the HMMA pipe's; GPM's any-tensor share is the same on a bf16 or fp16 job, and the HMMA
    # pipe alone is behind --collector.gpu.gpm-detail.
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ratio", "{gpufleet_gpu_tensor_active_ratio}"),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "ratio", "{gpufleet_gpu_dram_active_ratio}"),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "bytes per second", "max without (direction) ({pcie_transmit})"),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "bytes per second", "max without (direction) ({pcie_receive})"),
)

# Series with a label matcher, named for the FIELDS templates.
_SELECTED = {
    "sm_clock": ("gpufleet_gpu_clock_hertz", 'clock="sm"'),
    "memory_clock": ("gpufleet_gpu_clock_hertz", 'clock="memory"'),
    "uncorrectable_rows": ("gpufleet_gpu_remapped_rows", 'cause="uncorrectable"'),
    "correctable_rows": ("gpufleet_gpu_remapped_rows", 'cause="correctable"'),
    "pcie_transmit": ("gpufleet_gpu_pcie_throughput_bytes_per_second", 'direction="transmit"'),
    "pcie_receive": ("gpufleet_gpu_pcie_throughput_bytes_per_second", 'direction="receive"'),
}
# dcgm-exporter's default fields the layer does not record, and why.
UNSUPPORTED = {
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "typed a counter but served as a rate, in a unit DCGM does not state "
                                          "(NVIDIA's DeepOps dashboards read KiB/s, its maintainers answer KB/s, "
                                          "users measure MB/s): no value would match every dashboard that reads it. "
                                          "gpufleet_gpu_nvlink_transmit_bytes_total and "
                                          "gpufleet_gpu_nvlink_receive_bytes_total count NVLink traffic in bytes",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU licensing: a bare-metal training node has none to report",
}


def _series(c: Config, name: str) -> str:
    if name in _SELECTED:
        metric, matcher = _SELECTED[name]
        return c.metric(metric, matcher)
    return c.metric(name)


def _labelled(c: Config, expr: str) -> str:
    """`expr` with dcgm-exporter's labels of its GPU joined on."""
    return f"{expr} * on ({c.by('instance', 'gpu', 'uuid')}) group_left ({', '.join(DCGM_LABELS)}) {LABELS}"


def _info(c: Config) -> str:
    """One series per GPU with dcgm-exporter's labels of the GPU: gpufleet_gpu_info's, renamed."""
    info = c.metric("gpufleet_gpu_info")
    for target, replacement, source, regex in (("UUID", "$1", "uuid", "(.*)"), ("modelName", "$1", "name", "(.*)"),
                                               ("device", "nvidia$1", "gpu", "(.*)"),
                                               ("DCGM_FI_DRIVER_VERSION", "$1", "driver_version", "(.*)"),
                                               ("Hostname", "$1", "instance", "([^:]+)(:[0-9]+)?")):
        info = f'label_replace({info}, "{target}", "{replacement}", "{source}", "{regex}")'
    return f"max by ({c.by('instance', 'gpu', 'uuid')}, {', '.join(GPU_LABELS)}) ({info})"


def _labels(c: Config) -> str:
    """INFO with the labels of one job, where the GPU runs one (the first by label order where it runs several, as
    dcgm-exporter names one pod per GPU)."""
    gpu = c.by("instance", "gpu", "uuid")
    batch = c.metric("gpufleet_gpu_job_info", 'scheduler!="kubernetes"')
    pods = c.metric("gpufleet_gpu_job_info", 'scheduler="kubernetes"')
    one_job = f'topk by ({gpu}) (1, label_replace({batch}, "hpc_job", "$1", "job_id", "(.+)") or {pods})'
    return f"{INFO} * on ({gpu}) group_left ({', '.join(JOB_LABELS)}) {one_job} or on ({gpu}) {INFO}"


def _xid(c: Config) -> str:
    """dcgm-exporter's XID field: the code of the GPU's latest XID as a gauge, 0 where it has had none. PromQL
    cannot turn a label into a value, so each code of the XID catalogue is one branch; a code outside it reads 0."""
    branches = " or ".join(f'{XID_LATEST}{{xid="{code}"}} * 0 + {code}' for code in xid.CLASSED)
    never = f"0 * {c.metric('gpufleet_gpu_up')}"
    return _labelled(c, f"(max without (xid) ({branches}) or on ({c.by('instance', 'gpu', 'uuid')}) {never})")


def dcgm_compat(c: Config) -> list[dict[str, Any]]:
    """The layer's two groups. The fields every `FIELDS_INTERVAL`, the interval at which dcgm-exporter itself
    collects by default, so that nothing reads them at a finer grain than it did. Their labels every
    `LABELS_INTERVAL`: they change when a job starts or ends, and relabelling every GPU's metadata is the layer's
    dearest rule."""
    fields = [record(XID_LATEST, f"topk by ({c.by('instance', 'gpu', 'uuid')}) "
                                 f"(1, {c.metric('gpufleet_gpu_xid_last_timestamp_seconds')})")]
    fields += [record(field.name, _labelled(c, f"({converted(c, field)})")) for field in FIELDS]
    fields.append(record("DCGM_FI_DEV_XID_ERRORS", _xid(c)))
    labels = [record(INFO, _info(c)), record(LABELS, _labels(c))]
    return [{"name": "gpufleet-dcgm-labels", "interval": c.d(LABELS_INTERVAL), "rules": labels},
            {"name": "gpufleet-dcgm-compat", "interval": c.d(FIELDS_INTERVAL), "rules": fields}]


def converted(c: Config, field: Field) -> str:
    """The field in dcgm-exporter's unit, before its labels are joined on."""
    return field.template.format(**{name: _series(c, name) for name in _names(field.template)})


def _names(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]
