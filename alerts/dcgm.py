"""The dcgm-exporter compatibility layer: dcgm-exporter's default metric set, recorded from gpufleet's series
under dcgm-exporter's names, units and labels, so that the dashboards, rules and alerts a site wrote for
dcgm-exporter read gpufleet's data without a change.

Opt-in and in a file of its own (`gpufleet-dcgm-rules.yml`): it costs a rule evaluation per field at every
interval, and a site that has moved its own queries to gpufleet's names drops the file. The names and units
are those of dcgm-exporter's `etc/default-counters.csv`, the set NVIDIA's published dashboard reads; what
cannot be supplied is listed in `UNSUPPORTED`, with the reason, and in docs/exporter/dcgm-exporter.md.

Each field keeps gpufleet's labels (`gpu`, `uuid`, the target's) and gains dcgm-exporter's: `UUID`,
`modelName`, `device` (`nvidia0`), `pci_bus_id`, `DCGM_FI_DRIVER_VERSION` and `Hostname`, and, on a GPU that
runs a job, `pod` and `namespace` (Kubernetes) or `hpc_job` (Slurm, or a job-mapping directory) as
dcgm-exporter's job mapping sets them.
"""

from __future__ import annotations

import string
from typing import Any

from gpufleet import xid
from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import record

LABELS = "gpu:gpufleet_dcgm_labels:info"
XID_LATEST = "gpu:gpufleet_xid_latest:timestamp"
# dcgm-exporter's labels that the layer adds to every field, from LABELS.
DCGM_LABELS = ("UUID", "modelName", "device", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "Hostname", "pod", "namespace",
               "hpc_job")
MIB = 1024 * 1024

# dcgm-exporter's field name, and gpufleet's series in dcgm-exporter's unit.
FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": 'max without (clock) ({sm_clock}) / 1e6',  # MHz
    "DCGM_FI_DEV_MEM_CLOCK": 'max without (clock) ({memory_clock}) / 1e6',  # MHz
    "DCGM_FI_DEV_MEMORY_TEMP": "{gpufleet_gpu_memory_temperature_celsius}",  # C
    "DCGM_FI_DEV_GPU_TEMP": "{gpufleet_gpu_temperature_celsius}",  # C
    "DCGM_FI_DEV_POWER_USAGE": "{gpufleet_gpu_power_watts}",  # W
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "{gpufleet_gpu_energy_joules_total} * 1000",  # mJ
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "{gpufleet_gpu_pcie_replays_total}",
    "DCGM_FI_DEV_GPU_UTIL": "{gpufleet_gpu_utilization_ratio} * 100",  # %
    "DCGM_FI_DEV_MEM_COPY_UTIL": "{gpufleet_gpu_memory_copy_utilization_ratio} * 100",
    "DCGM_FI_DEV_ENC_UTIL": "{gpufleet_gpu_encoder_utilization_ratio} * 100",
    "DCGM_FI_DEV_DEC_UTIL": "{gpufleet_gpu_decoder_utilization_ratio} * 100",
    "DCGM_FI_DEV_FB_FREE": f"{{gpufleet_gpu_memory_free_bytes}} / {MIB}",  # MiB
    "DCGM_FI_DEV_FB_USED": f"{{gpufleet_gpu_memory_used_bytes}} / {MIB}",
    "DCGM_FI_DEV_FB_RESERVED": f"{{gpufleet_gpu_memory_reserved_bytes}} / {MIB}",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 'max without (cause) ({uncorrectable_rows})',
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 'max without (cause) ({correctable_rows})',
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "{gpufleet_gpu_row_remap_failed}",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "{gpufleet_gpu_graphics_active_ratio}",  # ratio, as dcgm-exporter's
    "DCGM_FI_PROF_SM_ACTIVE": "{gpufleet_gpu_sm_active_ratio}",
    # dcgm-exporter's is the HMMA pipe's; GPM's any-tensor share is the same on a bf16 or fp16 job, and the HMMA
    # pipe alone is behind --collector.gpu.gpm-detail.
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "{gpufleet_gpu_tensor_active_ratio}",
    "DCGM_FI_PROF_DRAM_ACTIVE": "{gpufleet_gpu_dram_active_ratio}",
    "DCGM_FI_PROF_PCIE_TX_BYTES": 'max without (direction) ({pcie_transmit})',  # bytes per second
    "DCGM_FI_PROF_PCIE_RX_BYTES": 'max without (direction) ({pcie_receive})',
}
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
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM documents no unit for it; gpufleet_gpu_nvlink_transmit_bytes_total "
                                          "and gpufleet_gpu_nvlink_receive_bytes_total count NVLink traffic in bytes",
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


def _labels(c: Config) -> str:
    """One series per GPU with dcgm-exporter's labels: gpufleet_gpu_info's renamed, and one job's, where the GPU
    runs one (the first by label order where it runs several, as dcgm-exporter names one pod per GPU)."""
    info = c.metric("gpufleet_gpu_info")
    for target, replacement, source, regex in (("UUID", "$1", "uuid", "(.*)"), ("modelName", "$1", "name", "(.*)"),
                                               ("device", "nvidia$1", "gpu", "(.*)"),
                                               ("DCGM_FI_DRIVER_VERSION", "$1", "driver_version", "(.*)"),
                                               ("Hostname", "$1", "instance", "([^:]+)(:[0-9]+)?")):
        info = f'label_replace({info}, "{target}", "{replacement}", "{source}", "{regex}")'
    gpu = c.by("instance", "gpu", "uuid")
    base = f"max by ({gpu}, {', '.join(DCGM_LABELS[:6])}) ({info})"
    batch = c.metric("gpufleet_gpu_job_info", 'scheduler!="kubernetes"')
    pods = c.metric("gpufleet_gpu_job_info", 'scheduler="kubernetes"')
    one_job = f'topk by ({gpu}) (1, label_replace({batch}, "hpc_job", "$1", "job_id", "(.+)") or {pods})'
    return f"{base} * on ({gpu}) group_left (pod, namespace, hpc_job) {one_job} or on ({gpu}) {base}"


def _xid(c: Config) -> str:
    """dcgm-exporter's XID field: the code of the GPU's latest XID as a gauge, 0 where it has had none. PromQL
    cannot turn a label into a value, so each code of the XID catalogue is one branch; a code outside it reads 0."""
    codes = sorted({code for codes in xid.CLASSES.values() for code in codes})
    branches = " or ".join(f'{XID_LATEST}{{xid="{code}"}} * 0 + {code}' for code in codes)
    never = f"0 * {c.metric('gpufleet_gpu_up')}"
    return _labelled(c, f"(max without (xid) ({branches}) or on ({c.by('instance', 'gpu', 'uuid')}) {never})")


def dcgm_compat(c: Config) -> dict[str, Any]:
    """The layer's one group, at the evaluation interval like the pager's: dcgm-exporter's fields are read as the
    exporter's own series would be, at the scrape interval."""
    names = {name for template in FIELDS.values() for name in _names(template)}
    series = {name: _series(c, name) for name in names}
    rules = [record(LABELS, _labels(c)),
             record(XID_LATEST, f"topk by ({c.by('instance', 'gpu', 'uuid')}) "
                                f"(1, {c.metric('gpufleet_gpu_xid_last_timestamp_seconds')})")]
    rules += [record(field, _labelled(c, f"({template.format(**series)})")) for field, template in FIELDS.items()]
    rules.append(record("DCGM_FI_DEV_XID_ERRORS", _xid(c)))
    return {"name": "gpufleet-dcgm-compat", "rules": rules}


def _names(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]
