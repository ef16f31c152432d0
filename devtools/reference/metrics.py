"""The metric reference: every family the exporter serves, read from what its own code serves.

Three expositions, all built by the exporter's collectors over simulated hardware (`gpufleet.devtools.nodes`):
the benchmark's 8-GPU node at the default flags, which says what is on by default and how many series a node
spends on each family; the same node with each opt-in flag on, which says what each flag adds; and the
catalogue node (the golden boards with every sparse state set, every opt-in flag on), which holds the families
that exist only while something applies.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools.nodes import SERIES_BUDGET, bench_node, catalogue_exposition
from gpufleet.devtools.reference.markdown import GENERATED, cell, code, table
from gpufleet.exporter import node

# The flags that add families, each with its flag: the other opt-in flags read the host (the kernel log, the
# kubelet's socket) and add series to families that are on anyway.
OPT_IN = {"gpu_gpm_detail": "--collector.gpu.gpm-detail", "gpu_process_memory": "--collector.gpu.process-memory",
          "gpu_nvlink_per_link": "--collector.gpu.nvlink-per-link"}
# Labels that name a thing rather than take one of a few values: their values are not listed.
IDENTITIES = {"gpu", "uuid", "name", "pci_bus_id", "serial", "vbios", "driver_version", "cuda_version", "job_id",
              "user_id", "pod_uid", "container_id", "namespace", "pod", "mig_uuid", "gpu_instance", "compute_instance",
              "pid", "device", "port", "address", "board_id", "firmware_version", "hca_type", "node_guid", "chip",
              "sensor", "label", "zone", "type", "link", "fan", "version", "python_version", "xid", "profile",
              "trip_point", "qos_class", "bridge", "slot", "switch", "sxid"}
UNITS = (("_bytes_per_second", "bytes/s"), ("_bytes_total", "bytes"), ("_bytes", "bytes"),
         ("_seconds_total", "seconds"), ("_seconds", "seconds"), ("_celsius", "°C"), ("_watts", "watts"),
         ("_joules_total", "joules"), ("_hertz", "hertz"), ("_ratio", "ratio (0-1)"), ("_rpm", "rpm"),
         ("_volts", "volts"), ("_amperes", "amperes"))
SECTIONS = (("GPU (`gpu` collector)", "gpufleet_gpu_"), ("Ethernet (`network` collector)", "gpufleet_network_"),
            ("InfiniBand and RoCE (`infiniband` collector)", "gpufleet_infiniband_"),
            ("Sensors (`hwmon` and `thermal_zone` collectors)", "gpufleet_hwmon_"), ("", "gpufleet_thermal_zone_"),
            ("PCIe errors (`pcie` collector)", "gpufleet_pcie_"),
            ("Kernel log (`kernel` collector)", "gpufleet_kernel_"), ("", "gpufleet_nvswitch_"),
            ("The exporter itself", "gpufleet_collector_"), ("", "gpufleet_exporter_"), ("", "process_"))


@dataclass
class Family:
    name: str
    kind: str
    help: str
    labels: dict[str, set[str]] = field(default_factory=dict)
    series: int = 0

    def unit(self) -> str:
        return next((unit for suffix, unit in UNITS if self.name.endswith(suffix)), "")

    def label_text(self) -> str:
        parts = []
        for label, values in sorted(self.labels.items()):
            listed = sorted(values)
            shown = label in IDENTITIES or len(listed) > 12 or not listed
            parts.append(code(label) if shown else f"{code(label)} ({', '.join(code(v) for v in listed)})")
        return ", ".join(parts)


def exposed(name: str, kind: str) -> str:
    """A family's name as its series carry it: the parser takes `_total` off a counter's."""
    return f"{name}_total" if kind == "counter" else name


def families(text: str) -> dict[str, Family]:
    found: dict[str, Family] = {}
    for metric in text_string_to_metric_families(text):
        name = exposed(metric.name, metric.type)
        family = found.setdefault(name, Family(name, metric.type, metric.documentation))
        family.series += len(metric.samples)
        for sample in metric.samples:
            for label, value in sample.labels.items():
                family.labels.setdefault(label, set()).add(value)
    return found


def _with(flag: str) -> argparse.Namespace:
    flags = node.defaults()
    setattr(flags, flag, True)
    return flags


def page() -> str:
    default_text = bench_node()
    default = families(default_text)
    counts = {name: family.series for name, family in default.items()}
    added = {name: OPT_IN[flag] for flag in OPT_IN for name in families(bench_node(_with(flag))) if name not in default}
    everything = node.defaults()
    for flag in OPT_IN:
        setattr(everything, flag, True)
    catalogue = families(catalogue_exposition(everything)) | families(bench_node(everything))
    for name, family in default.items():  # The benchmark's node has its own devices: its label values count too.
        for label, values in family.labels.items():
            catalogue[name].labels.setdefault(label, set()).update(values)
    total = sum(counts.values())
    lines = [GENERATED.format(source="what the exporter's collectors serve over simulated hardware"), INTRO.format(
        total=total, budget=SERIES_BUDGET)]
    for title, prefix in SECTIONS:
        if title:
            lines.append(f"\n## {title}\n")
        rows = []
        for name in sorted(n for n in catalogue if n.startswith(prefix)):
            family = catalogue[name]
            when = "default" if name in default else (f"with {code(added[name])}" if name in added else "where present")
            rows.append((code(name), family.kind, family.unit(), family.label_text(), when, counts.get(name, 0),
                         cell(family.help)))
        if rows:
            lines.append(table(["metric", "type", "unit", "labels", "served", "series per node", "help"], rows))
    return "\n".join(lines)


INTRO = """# Metrics

Every metric family the exporter serves, as its own code serves it. **Served** says when: `default`; with an
opt-in flag; or `where present`, a family that exists only while what it reports applies (an XID seen, a link down or
erring, a MIG mode pending, a board that has the feature), never as a zero. **Series per node** counts the
benchmark's node (8 simulated H100s, 8 InfiniBand ports, 4 Ethernet interfaces, 32 hwmon sensors, 20 PCIe
links) at the default flags: {total} series in all, against a budget of {budget}. Families named after sysfs files (the
InfiniBand, RoCE and Ethernet counters) follow the files a device has; the list shows those of the fixture
trees. Label values are listed where a label takes one of a few.

Every series carries the labels the scrape adds (`instance`, `job`, and `cluster` by convention); the exporter
adds none of those itself. GPU series carry `gpu` (the NVML index) and `uuid`.
"""
