"""The dcgm-exporter reference: each of dcgm-exporter's default fields and the gpufleet series the compatibility
layer records it from, both ways, with the labels it adds and the fields it leaves out."""

from __future__ import annotations

from gpufleet.alerts import dcgm
from gpufleet.alerts.config import Config
from gpufleet.devtools.reference.markdown import GENERATED, code, table

INTRO = """# dcgm-exporter names

What the opt-in compatibility layer (`alerts/gpufleet-dcgm-rules.yml`) records, at the default configuration:
{fields} of dcgm-exporter's default fields, each from gpufleet's series in dcgm-exporter's unit. How to turn it on,
what changes meaning and how to migrate are in [dcgm-exporter](../exporter/dcgm-exporter.md).
"""


def page() -> str:
    c = Config()
    fields = [(code(f.name), f.unit, code(dcgm.converted(c, f))) for f in dcgm.FIELDS]
    fields.append((code("DCGM_FI_DEV_XID_ERRORS"), "XID code (gauge)",
                   "the code of the GPU's latest XID, from " + code("gpufleet_gpu_xid_last_timestamp_seconds")
                   + "; 0 where it has had none"))
    ours = sorted((series, name) for name, _, series in fields)
    return "\n".join([
        GENERATED.format(source="alerts/dcgm.py"), INTRO.format(fields=len(fields)),
        "## From dcgm-exporter's names\n", table(["dcgm-exporter field", "unit", "recorded from"], fields),
        "\n## From gpufleet's series\n", table(["gpufleet series, converted", "dcgm-exporter field"], ours),
        "\n## Labels\n",
        "Each field keeps gpufleet's labels and gains dcgm-exporter's, from `gpufleet_gpu_info` and "
        "`gpufleet_gpu_job_info`:\n",
        table(["label", "value"], [(code(label), meaning) for label, meaning in LABELS.items()]),
        "\n## Not recorded\n",
        table(["dcgm-exporter field", "why"], [(code(name), why) for name, why in dcgm.UNSUPPORTED.items()]),
    ])


LABELS = {
    "UUID": "the GPU's UUID (gpufleet's `uuid`)",
    "modelName": "the board's name (gpufleet's `name` on `gpufleet_gpu_info`)",
    "device": "`nvidia` and the GPU's index",
    "pci_bus_id": "the GPU's PCI address",
    "DCGM_FI_DRIVER_VERSION": "the driver's version",
    "Hostname": "the target's `instance` without its port",
    "pod, namespace, container": "the Kubernetes pod and container running on the GPU, where the exporter names "
                                 "pods (`--job.pod-resources`)",
    "hpc_job": "the Slurm job, or the job of a job-mapping directory, running on the GPU",
}
