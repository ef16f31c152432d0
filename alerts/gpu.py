"""Failing GPUs: the recovery action each needs, XIDs by class, memory errors, lost boards, NVLink, PCIe and
hardware slowdowns.

A GPU that needs a reset, a reboot or a new board pages (or tickets) from the recovery action the exporter
holds for it, which lasts until the action is seen done: never from an event's window, which would resolve
while the GPU is still broken. The events themselves (XIDs, new uncorrectable ECC errors) are information for
the dashboards; they fire on the event's timestamp rather than on `increase()`, which misses the first event
of a new series.
"""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.maintenance import out_of_service
from gpufleet.alerts.recording import (
    ECC_NEW,
    NODE_WORK,
    PCIE_DEGRADED,
    PCIE_REPLAYS,
    SLOWDOWN,
    STAKE_WINDOW,
    ecc_new,
    pcie_degraded,
    share_of_time,
)
from gpufleet.alerts.rule import GPU, TREND_INTERVAL, held_while, matcher, printf, with_matchers
from gpufleet.alerts.rule import alert as node_alert
from gpufleet.fabric import REGISTRATION_FAILED as FABRIC_FAILED
from gpufleet.xid import APPLICATION, CLASSED, RESET_OR_REBOOT, WATCH, Action

_CRC = 'error=~"crc_flit|crc_data"'
_HW_SLOWDOWN = 'reason=~"hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"'


def alert(c: Config, name: str, expr: str, severity: str, summary: str, description: str,
          for_: str | None = None) -> dict[str, Any]:
    """An alert on the GPU collector's series, which also stop while the node's driver does not answer."""
    return node_alert(c, name, expr, severity, summary, description, for_=for_, gpu=True)


def _xid_event(c: Config, name: str, codes: tuple[int, ...], severity: str, summary: str,
               outside: bool = False) -> dict[str, Any]:
    """An alert that fires for `xid_window` after an XID of one class (with `outside`, of none of `codes`), timed
    from the event itself."""
    since = f"time() - {c.metric('gpufleet_gpu_xid_last_timestamp_seconds', matcher(codes, outside))}"
    return alert(c, name, f"{since} < {duration.parse(c.d(c.xid_window)):g}", severity, summary,
                 f"{GPU} reported XID {{{{ $labels.xid }}}} {{{{ $value | humanizeDuration }}}} ago.")


def _needs(c: Config, name: str, action: Action, severity: str, summary: str, what: str,
           deferred: bool | None = None) -> dict[str, Any]:
    """An alert for GPUs held at one recovery action: it fires while the exporter holds it, which is until the
    action is seen done (a reset, a reboot, another board), however long that takes and across restarts.

    Each carries `remediation="drain"`, which routes it to `gpufleet remediate` too: the node is drained while
    the alert fires, and resumed after it resolves. `remediation_reason` is the drain's reason in Slurm. With
    `deferred`, only the GPUs whose action can wait for the node's next drain (a contained memory error), which
    drains nothing; with `deferred=False`, the others."""
    reason = printf(c.metric("gpufleet_gpu_recovery_action_reason", f'{c.cluster_label}="%s",instance="%s",uuid="%s"'),
                    f"$labels.{c.cluster_label}", "$labels.instance", "$labels.uuid")
    expr = f"{c.metric('gpufleet_gpu_recovery_action')} == {int(action)}"
    if deferred is not None:
        waits = f"on ({c.by('instance', 'gpu')}) {c.metric('gpufleet_gpu_recovery_action_deferred')} == 1"
        expr = f"{expr} {'and' if deferred else 'unless'} {waits}"
    rule = alert(c, name, expr, severity, summary,
                 f"{GPU} needs {what}{{{{ with {reason} | query }}}}{{{{ with first . }}}}: "
                 "{{ .Labels.reason }}, since {{ .Value | humanizeTimestamp }}{{ end }}{{ end }}. "
                 "The alert stays until the exporter sees it done.")
    if deferred:
        return rule
    rule["labels"]["remediation"] = "drain"
    rule["annotations"]["remediation_reason"] = (
        f"GPU {{{{ $labels.gpu }}}} needs {what}{{{{ with {reason} | query }}}}{{{{ with first . }}}} "
        "({{ .Labels.reason }}){{ end }}{{ end }}")
    return rule


def driver_stake(c: Config) -> str:
    """The nodes whose GPUs had work in the last STAKE_WINDOW (NODE_WORK), or hold a recovery action: a hung driver
    there is GpuDriverUnresponsive's page, and elsewhere the GPU collector's ticket."""
    return f"{NODE_WORK} or max by ({c.by('instance')}) ({c.metric('gpufleet_gpu_recovery_action')}) > 0"


def _repair_urgent(c: Config) -> dict[str, Any]:
    """The page for a node whose GPU repair cannot wait for morning; the repair alerts themselves are tickets.

    Whether a repair pages is decided when it is raised, and held until every repair of the node is done: a
    page that ended because the node was drained after it would be a page that resolved while its fault held.
    It pages at once where the node's GPUs had work in the last STAKE_WINDOW (a job is at stake whether or not
    the node is drained by now), and after `drain_grace` where the node is still in service then (no
    `gpufleet remediate`, its dry run, its breaker open, Slurm unreachable): the scheduler would place work on a
    broken GPU. An idle node drained in time (by `gpufleet remediate`, a person or a health check) has nothing
    to lose tonight: its repair is the ticket alone. Each repair alert keeps its labels, so the remediator's
    view of its episode is the same either way; only the routing sends it to the ticket receiver instead of
    the pager. A warning repair (a replacement) never pages."""
    node = c.by("instance")
    repair = 'ALERTS{alertstate="firing",remediation="drain",severity="critical"}'
    repairs = f"max by ({c.node()}) ({repair})"
    raised_before = f"group by ({node}) ({repair} offset {c.d(c.drain_grace)})"
    urgent = f"{repairs} and on ({node}) ({NODE_WORK} or ({raised_before} unless on ({node}) {out_of_service(c)}))"
    which = printf(with_matchers(repair, f'{c.cluster_label}="%s",instance="%s"'), f"$labels.{c.cluster_label}",
                   "$labels.instance")
    return node_alert(c, "GpuRepairUrgent", held_while(c, "GpuRepairUrgent", urgent, repairs), "critical",
                      "A GPU repair cannot wait: its node had work, or is still in service.",
                      "{{ $labels.instance }} needs {{ range $n, $a := " + which + " | query }}{{ if $n }}, "
                      "{{ end }}{{ $a.Labels.alertname }}{{ with $a.Labels.gpu }} (GPU {{ . }}){{ end }}{{ end }}, "
                      "and its GPUs had work in the last " + STAKE_WINDOW + " or it is still in service "
                      f"{c.drain_grace} after the repair was raised. The repairs themselves are tickets; this page "
                      "stays until every one of them is done.", held=False, at_stake=True)


def _driver_unresponsive(c: Config) -> dict[str, Any]:
    """The page for a node whose GPU driver stopped answering (NVML hangs, or fails as a whole) while its GPUs had
    work in the last STAKE_WINDOW or a held recovery action: once per node, however many GPUs it has, and it drains
    the node. Its GPUs' own pages are held meanwhile (`rule.alert`). An idle node's hung driver is the collector's
    ticket: nothing runs there to lose."""
    node = c.by("instance")
    # Once paging, it pages for as long as the driver does not answer: the work it had ages out of the window.
    busy = f'{driver_stake(c)} or ALERTS{{alertname="GpuDriverUnresponsive",alertstate="firing"}}'
    # Held while its exporter is not seen, not while its driver does not answer: that is its own condition.
    rule = node_alert(c, "GpuDriverUnresponsive", f"{c.metric('gpufleet_gpu_driver_up')} == 0 and on ({node}) ({busy})",
                 "critical", "A node's GPU driver stopped answering while its GPUs had work: drain it and reboot it.",
                 "NVML on {{ $labels.instance }} does not answer (a hung driver: a GSP timeout, XID 119 or 120, a "
                 "reset that never ends), or is unavailable as a whole, while its GPUs had work or a held recovery "
                 "action: nothing on it can be observed, and its jobs are stuck or will be.", for_="1m")
    rule["labels"]["remediation"] = "drain"
    rule["annotations"]["remediation_reason"] = "its GPU driver stopped answering (NVML hangs): reboot the node"
    return rule


def gpu_failures(c: Config) -> dict[str, Any]:
    """What pages for a GPU the moment it breaks, evaluated at the scrape interval: instant selectors over
    the raw series, and a window only over the sparse new-ECC-error series it records first."""
    rules = [
        ecc_new(c),
        _needs(c, "GpuNeedsDrain", Action.DRAIN, "critical", "A GPU's driver asks for its work to be drained.",
               "its work drained"),
        _needs(c, "GpuNeedsReset", Action.RESET, "critical", "A GPU needs a reset before it runs work again.",
               "a reset", deferred=False),
        # A contained memory error killed only the job that touched the memory; the GPU keeps working, and the reset
        # that lets its row remapping take effect waits for the node's next drain.
        _needs(c, "GpuNeedsResetAtDrain", Action.RESET, "warning",
               "A GPU needs a reset at its node's next drain: a contained memory error.", "a reset at its node's "
               "next drain", deferred=True),
        _needs(c, "GpuNeedsReboot", Action.REBOOT, "critical", "A GPU needs its node rebooted before it runs work "
               "again.", "its node rebooted"),
        _needs(c, "GpuNeedsReplacement", Action.REPLACE, "warning", "A GPU needs to be replaced: an RMA.",
               "replacing"),
        # The events themselves, for the dashboards: the recovery action they raise is what pages.
        _xid_event(c, "GpuXidCritical", RESET_OR_REBOOT, "info",
                   "A GPU reported an XID that needs a GPU reset or a reboot."),
        _xid_event(c, "GpuXidWarning", WATCH, "warning",
                   "A GPU reported a memory XID to watch (row remap, high single-bit rate, contained error)."),
        _xid_event(c, "GpuXidApplication", APPLICATION, "info",
                   "A GPU reported an application XID (the program's own fault)."),
        # A code the catalogue does not class raises no recovery action: someone must read what it means.
        _xid_event(c, "GpuXidUnclassified", CLASSED, "warning",
                   "A GPU reported an XID that gpufleet's catalogue does not class.", outside=True),
        _driver_unresponsive(c),
        # After the repairs it reads: in Prometheus it sees their ALERTS of this evaluation.
        _repair_urgent(c),
        # A GPU held at a reboot is off the bus: the reboot's ticket, and GpuRepairUrgent's page where it cannot
        # wait, say so. Alertmanager would mute this alert for it anyway; standing aside here keeps it from opening
        # the node's pager incident muted, which Alertmanager counts as sent, so that the urgent repair joining
        # it `drain_grace` later would wait for the incident's next group_interval (alertmanager#2496). Read from
        # the reboot's ALERTS, which fire at once, within this one's `for`.
        alert(c, "GpuLost", f"{c.metric('gpufleet_gpu_up')} == 0 unless on ({c.by('instance', 'gpu')}) "
                            'ALERTS{alertname="GpuNeedsReboot",alertstate="firing"}', "critical",
              "A GPU stopped answering NVML.",
              f"{GPU} is lost: NVML no longer answers for it.", for_="1m"),
        alert(c, "GpuMissingFromNvml",
              f"{c.metric('gpufleet_gpu_pci_devices')} > on ({c.by('instance')}) group_left () "
              f"{c.metric('gpufleet_gpu_devices')}",
              "critical", "A node has GPUs on its PCI bus that NVML does not list.",
              "{{ $labels.instance }} has {{ $value }} NVIDIA GPUs on the PCI bus, more than NVML lists.",
              for_="5m"),
        alert(c, "GpuEccUncorrectable", f"max_over_time({ECC_NEW}[{c.d(c.ecc_window)}])", "info",
              "A GPU had an uncorrectable ECC error.",
              f"{GPU} counted uncorrectable ECC errors in the last {c.ecc_window}, {{{{ $value | humanize }}}} "
              "within one minute at most."),
        # The fabric manager registers every GPU of an HGX board within seconds of a boot or a reset: five minutes
        # not registered is a GPU no job can use with its peers.
        # A registration that completed with an error is as unusable (fabric health 4).
        alert(c, "GpuFabricNotReady", f"{c.metric('gpufleet_gpu_fabric_state')} != 3 or "
                                      f"{c.metric('gpufleet_gpu_fabric_health')} == {FABRIC_FAILED}", "critical",
              "A GPU is not registered with its NVSwitch fabric: it cannot reach its peers over NVLink.",
              f"{GPU} {{{{ if eq $value {FABRIC_FAILED:.1f} }}}}failed its fabric registration{{{{ else }}}}has fabric "
              "state {{ $value }} (1 not started, 2 in progress; 3 is registered){{ end }}: jobs that need it fail "
              "at their first collective.", for_="5m"),
        alert(c, "GpuNvlinkDown", f"{c.metric('gpufleet_gpu_nvlink_up')} == 0", "critical",
              "An NVLink is down.", f"NVLink {{{{ $labels.link }}}} of {GPU} is down.", for_="2m"),
        alert(c, "GpuThermalMarginLow",
              f"{c.metric('gpufleet_gpu_thermal_margin_celsius')} < {c.thermal_margin_celsius:g}", "warning",
              "A GPU is about to slow down for heat.",
              f"{GPU} is {{{{ $value }}}} °C from thermal slowdown.", for_="2m"),
        alert(c, "NodeThermalMarginLow",
              f"count by ({c.node()}) ({c.metric('gpufleet_gpu_thermal_margin_celsius')} < "
              f"{c.thermal_margin_celsius:g}) >= {c.thermal_margin_gpus}", "critical",
              "Several GPUs of a node are about to slow down for heat: its cooling is failing.",
              f"{{{{ $value }}}} GPUs of {{{{ $labels.instance }}}} are within {c.thermal_margin_celsius:g} °C of "
              "thermal slowdown.", for_="2m"),
    ]
    return {"name": "gpufleet-gpu-failures", "rules": rules}


def gpu_trends(c: Config) -> dict[str, Any]:
    """What is judged over five minutes or more, or on series that only grow or change slowly, evaluated
    every `TREND_INTERVAL`: none is the first page for its fault."""
    hw_slowdown = SLOWDOWN + "{" + _HW_SLOWDOWN + "}"
    # Repeated: the last application XID's timestamp took two values within the window. Not `changes()`,
    # which in MetricsQL also counts the series' first sample, so vmalert fired on every first XID.
    last_xid = c.metric("gpufleet_gpu_xid_last_timestamp_seconds", matcher(APPLICATION))
    repeat = c.d(c.repeat_window)
    rules = [
        pcie_degraded(c),
        alert(c, "GpuPcieLinkDegraded", PCIE_DEGRADED, "warning",
              "A GPU's PCIe link runs below its maximum width or generation.",
              f"{GPU} runs its PCIe link below its maximum.", for_="10m"),
        alert(c, "GpuXidApplicationRepeated",
              f"max_over_time({last_xid}[{repeat}]) > min_over_time({last_xid}[{repeat}])", "warning",
              "An application XID repeats on the same GPU.",
              f"{GPU} reported XID {{{{ $labels.xid }}}} again within {c.repeat_window}."),
        alert(c, "GpuFabricDegraded", f"{c.metric('gpufleet_gpu_fabric_health')} > 1 < {FABRIC_FAILED}", "warning",
              "A GPU's NVSwitch fabric is unhealthy or runs at limited capacity.",
              f"{GPU} reports fabric health {{{{ $value }}}} (2 unhealthy, 3 limited capacity): its NVLink traffic "
              "runs below full bandwidth or over recovered routes.", for_="10m"),
        alert(c, "GpuCountDropped",
              f"{c.metric('gpufleet_gpu_devices')} < max_over_time({c.metric('gpufleet_gpu_devices')}"
              f"[{c.d(c.gpu_count_lookback)}])", "warning", "A node lists fewer GPUs than it did earlier today.",
              "{{ $labels.instance }} lists {{ $value }} GPUs, fewer than in the last "
              f"{c.gpu_count_lookback}.", for_="5m"),
        alert(c, "GpuRowRemapPending", f"{c.metric('gpufleet_gpu_row_remap_pending')} == 1", "warning",
              "A GPU has a row remap waiting for a GPU reset.",
              f"{GPU} has a row remap pending; reset the GPU when its job allows.", for_="5m"),
        alert(c, "GpuRetiredPagesPending", f"{c.metric('gpufleet_gpu_retired_pages_pending')} == 1", "warning",
              "A GPU has a page retirement waiting for a reboot.",
              f"{GPU} has a retired page pending; reboot the node when its job allows.", for_="5m"),
        alert(c, "GpuRetiredPagesHigh",
              f"sum by ({c.node('gpu', 'uuid')}) ({c.metric('gpufleet_gpu_retired_pages')}) >= "
              f"{c.retired_pages_critical}", "warning", "A GPU has retired many memory pages: an RMA candidate.",
              f"{GPU} has retired {{{{ $value }}}} pages."),
        alert(c, "GpuNvlinkCrcErrors",
              f"rate({c.metric('gpufleet_gpu_nvlink_link_errors_total', _CRC)}[{c.d('5m')}]) > "
              f"{c.nvlink_crc_per_second:g}", "warning", "An NVLink has a high CRC error rate.",
              f"NVLink {{{{ $labels.link }}}} of {GPU} has {{{{ $value | humanize }}}} {{{{ $labels.error }}}} "
              "errors per second.", for_="5m"),
        alert(c, "GpuPcieReplaysHigh", f"{PCIE_REPLAYS} * 60 > {c.pcie_replays_per_minute:g}", "warning",
              "A GPU's PCIe link retransmits too often.",
              f"{GPU} has {{{{ $value | humanize }}}} PCIe replays per minute.", for_="5m"),
        alert(c, "GpuHardwareSlowdown", f"{share_of_time(c, hw_slowdown, c.slowdown_window)} > {c.slowdown_share:g}",
              "warning", "A GPU's clocks are held down by hardware slowdown, thermal slowdown or power brake.",
              f"{GPU} had {{{{ $labels.reason }}}} active {{{{ $value | humanizePercentage }}}} of the last "
              f"{c.slowdown_window}."),
    ]
    return {"name": "gpufleet-gpu-trends", "interval": c.d(TREND_INTERVAL), "rules": rules}
