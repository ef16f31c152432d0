"""Host kernel trouble the exporter counts in the kernel log (`exporter/collector/kernel.py`): a ticket when one
kind of event repeats on a node. A single soft lockup or NFS timeout is noise on a busy node; several within
half an hour are a node that stalls its jobs, which the straggler alert also names as a likely cause. The group
runs every five minutes, as a ticket can wait that long."""

from __future__ import annotations

from typing import Any

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.drift import INTERVAL
from gpufleet.alerts.nvswitch import nvswitch_trends
from gpufleet.alerts.rule import alert
from gpufleet.alerts.storage import EXPLAINED, held_back

# Events that stall a node's processes for seconds: a likely cause of a straggler (`stragglers._causes`).
STALLS = ("soft_lockup", "hung_task", "storage_timeout")


def kernel(c: Config) -> dict[str, Any]:
    window = c.d(c.kernel_events_window)

    def repeated(events: str) -> str:
        # Rounded: increase() extrapolates to the window's edges, which can make 2 messages read 2.1.
        return (f"round(increase({c.metric('gpufleet_kernel_events_total', events)}[{window}])) "
                f">= {c.kernel_events_repeated}")

    # A node's timeouts and hung tasks during a storage outage are the outage's page (alerts/storage.py), and so
    # for a window after it, over which they would still count.
    explained = "|".join(EXPLAINED)
    lookback = duration.render(duration.parse(window) + duration.parse(c.d(c.storage_outage_window)))
    others, outages = repeated(f'event!~"{explained}"'), repeated(f'event=~"{explained}"')
    tickets = f"{others} or ({outages} unless on ({c.cluster_label}) ({held_back(c, lookback)}))"
    return {"name": "gpufleet-kernel", "interval": c.d(INTERVAL), "rules": [
        alert(c, "NodeKernelEventsRepeated", tickets, "warning",
              "A node's kernel logs the same trouble again and again: soft lockups, hung tasks, storage timeouts, "
              "machine checks or OOM kills.",
              f"{{{{ $labels.instance }}}} logged {{{{ $value }}}} {{{{ $labels.event }}}} messages in "
              f"{c.kernel_events_window}."),
        *nvswitch_trends(c),
    ]}
