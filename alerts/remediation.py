"""`gpufleet remediate`'s own alerts: when it stops draining (its breaker), when a repaired node fails the
site's check and stays drained, and when it cannot reach Slurm. Its series are its own, so none is held
while a node's exporter is down."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.rule import TREND_INTERVAL, alert


def remediation(c: Config) -> dict[str, Any]:
    job = f'job="{c.remediate_job}"'
    rules = [
        # One page for the breaker, however many drains it then refuses: each refused node's own GPU alert
        # already paged.
        alert(c, "RemediationBreakerOpen", f"gpufleet_remediate_breaker_open{{{job}}} == 1", "critical",
              "gpufleet remediate stopped draining nodes: its breaker opened.",
              "{{ $labels.instance }} drained as many nodes within an hour as it may. GPUs that need a repair now "
              "stay in service until someone looks, then closes the breaker.", held=False),
        alert(c, "RemediationCheckFailed", f"gpufleet_remediate_check_failed{{{job}}} == 1", "warning",
              "A node failed its check after a GPU repair: it stays drained.",
              "Slurm node {{ $labels.node }} was repaired, but the site's check failed: gpufleet keeps it "
              "drained, with the check's output as its reason (`sinfo -n {{ $labels.node }} -o %E`).", held=False),
        alert(c, "RemediationSlurmUnreachable", f"gpufleet_remediate_slurm_up{{{job}}} == 0", "warning",
              "gpufleet remediate cannot reach the Slurm controller: drains and resumes wait.",
              "{{ $labels.instance }}'s calls to Slurm have failed for 10 minutes; it keeps trying, and acts "
              "once Slurm answers.", for_="10m", held=False),
    ]
    return {"name": "gpufleet-remediation", "interval": c.d(TREND_INTERVAL), "rules": rules}
