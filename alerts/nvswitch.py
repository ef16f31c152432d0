"""What the NVSwitches of an HGX board report in the kernel log: SXids, counted per switch, code and class since
the node booted (`exporter.sxid`). A fatal one stalls the NVLink fabric of the whole board: its jobs fail with XID
45 or 74 until every GPU and NVSwitch of the board is reset together or the node reboots. The exporter holds each
GPU of the board at a reset for it (`exporter.gpu.actions`), so the repair is the GPUs' own: GpuNeedsReset's
tickets, which drain the node, and GpuRepairUrgent's one page where a job is at stake. The SXid itself is the
node's ticket, which says why each GPU is held and that one GPU's reset will not do; it ends with those holds, or,
on a node whose GPU collector is not running, with the reboot that starts the counts again. Non-fatal SXids that
repeat are a link to look at, a ticket. A node whose kernel log cannot be read shows no SXid either; where that is
a share of a cluster, a ticket says the SXids of those nodes are not seen."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import alert, printf
from gpufleet.fabric import BOARD_RESET_REASON

SXIDS = "gpufleet_nvswitch_sxid_errors_total"


def nvswitch(c: Config) -> dict[str, Any]:
    """The ticket, at the evaluation interval: the series are sparse, one per switch and code that erred."""
    node = c.by("instance")
    fatal = c.metric(SXIDS, 'class="fatal"')
    board = c.metric("gpufleet_gpu_recovery_action_reason", f'reason=~"{BOARD_RESET_REASON} .*"')
    # A GPU collector that answers and holds no GPU for the board has seen the board reset.
    released = (f"group by ({node}) ({c.metric('gpufleet_gpu_driver_up')}) "
                f"unless on ({node}) group by ({node}) ({board})")
    listed = printf(c.metric(SXIDS, f'{c.cluster_label}="%s",instance="%s",class="fatal"'),
                    f"$labels.{c.cluster_label}", "$labels.instance")
    codes = (f"{{{{ range $i, $s := {listed} | query }}}}{{{{ if $i }}}},{{{{ end }}}} {{{{ $s.Labels.sxid }}}} "
             "on {{ $s.Labels.switch }}{{ end }}")
    return {"name": "gpufleet-nvswitch", "rules": [
        alert(c, "NodeNvswitchFatalError", f"sum by ({c.node()}) ({fatal}) > 0 unless on ({node}) ({released})",
              "warning", "An NVSwitch of the node logged a fatal SXid: the board's NVLink fabric needs a reset.",
              f"{{{{ $labels.instance }}}} logged {{{{ $value }}}} fatal SXids since it booted (code and switch:"
              f"{codes}). Every GPU of the board is held at a reset (GpuNeedsReset) until all of its GPUs and "
              "NVSwitches are reset together, or the node reboots, and the fabric registers them again: one GPU's "
              "reset does not end it."),
    ]}


def nvswitch_trends(c: Config) -> list[dict[str, Any]]:
    """The tickets, for the kernel group's five-minute interval."""
    non_fatal = c.metric(SXIDS, 'class="non_fatal"')
    window = c.d(c.sxid_window)
    # Since the window began, or since the series appeared within it: the first error of a switch and code
    # is its series' first sample, which `increase()` would not count. The count at the window's start is the
    # last one seen in the window before it, so that a failed scrape there (a restart, a dark node) does not
    # take a series kept from before for a new one.
    before = f"last_over_time({non_fatal}[{window}] offset {window})"
    recent = f"({non_fatal} - {before} or ({non_fatal} unless {before}))"
    readable = c.metric("gpufleet_kernel_log_readable")
    blind = (f"count by ({c.by()}) ({readable} == 0) / count by ({c.by()}) ({readable}) "
             f"> {c.kernel_log_blind_share:g}")
    return [
        alert(c, "NodeNvswitchErrorsRepeated", f"{recent} >= {c.sxid_repeated}", "warning",
              "An NVSwitch keeps logging the same non-fatal SXid.",
              f"NVSwitch {{{{ $labels.switch }}}} of {{{{ $labels.instance }}}} logged SXid {{{{ $labels.sxid }}}} "
              f"{{{{ $value }}}} times in {c.sxid_window}."),
        alert(c, "NodesKernelLogUnreadable", blind, "warning",
              "Many nodes cannot read their kernel log: their SXids and host trouble go unseen.",
              f"The exporters of {{{{ $value | humanizePercentage }}}} of the nodes of "
              f"{{{{ $labels.{c.cluster_label} }}}} cannot read the kernel log: their NVSwitch errors, soft lockups "
              "and storage timeouts are not counted.", for_="30m", held=False),
    ]
