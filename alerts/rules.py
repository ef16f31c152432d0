"""The alerting rules, as code: one function per group, all reading one `Config`.

Conventions are those of kubernetes-mixin and node-mixin: CamelCase names with a
`Gpu`/`Nic`/`Node` prefix; `severity` critical (page now), warning (ticket) or
info (not routed); annotations `summary`, `description` and `runbook_url`.
Event alerts (XIDs) fire on the event's timestamp rather than on `increase()`,
which misses the first event of a new series.
"""

from __future__ import annotations

from typing import Any

import yaml

from alerts.config import Config
from alerts.xid import APPLICATION, RESET_OR_REBOOT, WATCH, matcher

_GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
_UNCORRECTED = ('error="uncorrected"', 'scope="volatile"')
_CRC = 'error=~"crc_flit|crc_data"'
_HW_SLOWDOWN = 'reason=~"hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"'


def _alert(config: Config, name: str, expr: str, severity: str, summary: str, description: str,
           for_: str | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description, "runbook_url": config.runbook(name)}
    return rule


def _xid_event(config: Config, name: str, codes: tuple[int, ...], severity: str, summary: str) -> dict[str, Any]:
    """An alert that fires for `xid_window` after an XID of one class, timed from the event itself."""
    since = f"time() - {config.metric('gpufleet_gpu_xid_last_timestamp_seconds', matcher(codes))}"
    return _alert(config, name, f"{since} < {_seconds(config.xid_window)}", severity, summary,
                  f"{_GPU} reported XID {{{{ $labels.xid }}}} {{{{ $value | humanizeDuration }}}} ago.")


def gpu_failures(c: Config) -> dict[str, Any]:
    rules = [
        _xid_event(c, "GpuXidCritical", RESET_OR_REBOOT, "critical",
                   "A GPU reported an XID that needs a GPU reset or a reboot."),
        _xid_event(c, "GpuXidWarning", WATCH, "warning",
                   "A GPU reported a memory XID to watch (row remap, high single-bit rate, contained error)."),
        _xid_event(c, "GpuXidApplication", APPLICATION, "info",
                   "A GPU reported an application XID (the program's own fault)."),
        _alert(c, "GpuXidApplicationRepeated",
               f"changes({c.metric('gpufleet_gpu_xid_last_timestamp_seconds', matcher(APPLICATION))}"
               f"[{c.repeat_window}]) >= 1", "warning",
               "An application XID repeats on the same GPU.",
               f"{_GPU} reported XID {{{{ $labels.xid }}}} again within {c.repeat_window}."),
        _alert(c, "GpuLost", f"{c.metric('gpufleet_gpu_up')} == 0", "critical",
               "A GPU stopped answering NVML.",
               f"{_GPU} is lost: NVML no longer answers for it.", for_="1m"),
        _alert(c, "GpuMissingFromNvml",
               f"{c.metric('gpufleet_gpu_pci_devices')} > on (instance) {c.metric('gpufleet_gpu_devices')}",
               "critical", "A node has GPUs on its PCI bus that NVML does not list.",
               "{{ $labels.instance }} has {{ $value }} NVIDIA GPUs on the PCI bus, more than NVML lists.",
               for_="5m"),
        _alert(c, "GpuCountDropped",
               f"{c.metric('gpufleet_gpu_devices')} < max_over_time({c.metric('gpufleet_gpu_devices')}"
               f"[{c.gpu_count_lookback}])", "critical", "A node lists fewer GPUs than it did earlier today.",
               "{{ $labels.instance }} lists {{ $value }} GPUs, fewer than in the last "
               f"{c.gpu_count_lookback}.", for_="5m"),
        _alert(c, "GpuEccUncorrectable",
               f"increase({c.metric('gpufleet_gpu_ecc_errors_total', *_UNCORRECTED)}"
               f"[{c.ecc_window}]) > 0", "critical", "A GPU had an uncorrectable ECC error.",
               f"{_GPU} had {{{{ $value | humanize }}}} uncorrectable ECC errors in {c.ecc_window}."),
        _alert(c, "GpuRowRemapFailed", f"{c.metric('gpufleet_gpu_row_remap_failed')} == 1", "critical",
               "A GPU failed to remap a memory row: an RMA candidate.",
               f"{_GPU} failed a row remap; it cannot repair its memory any more."),
        _alert(c, "GpuRowRemapPending", f"{c.metric('gpufleet_gpu_row_remap_pending')} == 1", "warning",
               "A GPU has a row remap waiting for a GPU reset.",
               f"{_GPU} has a row remap pending; reset the GPU when its job allows.", for_="5m"),
        _alert(c, "GpuRetiredPagesPending", f"{c.metric('gpufleet_gpu_retired_pages_pending')} == 1", "warning",
               "A GPU has a page retirement waiting for a reboot.",
               f"{_GPU} has a retired page pending; reboot the node when its job allows.", for_="5m"),
        _alert(c, "GpuRetiredPagesHigh",
               f"sum by (instance, gpu, uuid) ({c.metric('gpufleet_gpu_retired_pages')}) >= "
               f"{c.retired_pages_critical}", "critical", "A GPU has retired many memory pages: an RMA candidate.",
               f"{_GPU} has retired {{{{ $value }}}} pages."),
        _alert(c, "GpuNvlinkDown", f"{c.metric('gpufleet_gpu_nvlink_up')} == 0", "critical",
               "An NVLink is down.", f"NVLink {{{{ $labels.link }}}} of {_GPU} is down.", for_="2m"),
        _alert(c, "GpuNvlinkCrcErrors",
               f"rate({c.metric('gpufleet_gpu_nvlink_errors_total', _CRC)}[5m]) > "
               f"{c.nvlink_crc_per_second:g}", "warning", "An NVLink has a high CRC error rate.",
               f"NVLink {{{{ $labels.link }}}} of {_GPU} has {{{{ $value | humanize }}}} {{{{ $labels.error }}}} "
               "errors per second.", for_="5m"),
        _alert(c, "GpuPcieReplaysHigh",
               f"rate({c.metric('gpufleet_gpu_pcie_replays_total')}[5m]) * 60 > {c.pcie_replays_per_minute:g}",
               "warning", "A GPU's PCIe link retransmits too often.",
               f"{_GPU} has {{{{ $value | humanize }}}} PCIe replays per minute.", for_="5m"),
        # An idle GPU lowers its PCIe generation to save power: only a busy GPU's lower generation counts.
        _alert(c, "GpuPcieLinkDegraded",
               f"({c.metric('gpufleet_gpu_pcie_link_width')} < {c.metric('gpufleet_gpu_pcie_link_max_width')})"
               f" or (({c.metric('gpufleet_gpu_pcie_link_generation')} < "
               f"{c.metric('gpufleet_gpu_pcie_link_max_generation')}) and on (instance, gpu, uuid) "
               f"{c.metric('gpufleet_gpu_utilization_ratio')} > 0.5)", "warning",
               "A GPU's PCIe link runs below its maximum width or generation.",
               f"{_GPU} runs its PCIe link below its maximum.", for_="10m"),
        _alert(c, "GpuHardwareSlowdown",
               f"avg_over_time({c.metric('gpufleet_gpu_clock_event_active', _HW_SLOWDOWN)}"
               f"[{c.slowdown_window}]) > {c.slowdown_share:g}", "warning",
               "A GPU's clocks are held down by hardware slowdown, thermal slowdown or power brake.",
               f"{_GPU} had {{{{ $labels.reason }}}} active {{{{ $value | humanizePercentage }}}} of the last "
               f"{c.slowdown_window}."),
        _alert(c, "GpuThermalMarginLow",
               f"{c.metric('gpufleet_gpu_thermal_margin_celsius')} < {c.thermal_margin_celsius:g}", "critical",
               "A GPU is about to slow down for heat.",
               f"{_GPU} is {{{{ $value }}}} °C from thermal slowdown.", for_="2m"),
    ]
    return {"name": "gpufleet-gpu-failures", "rules": rules}


def exporter_health(c: Config) -> dict[str, Any]:
    rules = [
        _alert(c, "NodeExporterDown", f"up{{{c.selector}}} == 0" if c.selector else "up == 0", "critical",
               "A gpufleet exporter cannot be scraped.",
               "Prometheus cannot scrape {{ $labels.instance }}: its GPUs, NICs and sensors are unobserved.",
               for_="5m"),
        _alert(c, "NodeCollectorFailing", f"{c.metric('gpufleet_collector_success')} == 0", "warning",
               "An exporter collector keeps failing.",
               "The {{ $labels.collector }} collector of {{ $labels.instance }} has failed for 10 minutes; "
               "its log says why.", for_="10m"),
        _alert(c, "NodeCollectorStale",
               f"time() - {c.metric('gpufleet_collector_last_success_timestamp_seconds')} > {c.stale_seconds}",
               "warning", "An exporter collector has not succeeded recently.",
               "The {{ $labels.collector }} collector of {{ $labels.instance }} last succeeded "
               "{{ $value | humanizeDuration }} ago."),
    ]
    return {"name": "gpufleet-exporter", "rules": rules}


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return int(duration[:-1]) * units[duration[-1]]


def render(config: Config | None = None) -> str:
    config = config or Config()
    groups = [gpu_failures(config), exporter_health(config)]
    header = "# Generated by `gpufleet alerts build` from alerts/rules.py; edit that, not this file.\n"
    return header + yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000, allow_unicode=True)
