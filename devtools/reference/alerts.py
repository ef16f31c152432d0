"""The alert reference: every group, alert and recorded series of the generated rule file, at the defaults."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools.reference.markdown import GENERATED, cell, code, table

SEVERITIES = {"critical": "pages: someone acts now", "warning": "opens a ticket: someone acts within working hours",
              "info": "reaches nobody: for dashboards, and for the inhibition of other alerts",
              "none": "the Watchdog's alone: reaches the heartbeat service once a minute, never a person"}


def page(config: Config | None = None, rules: str | None = None) -> str:
    """The page for the rules `render(config)` writes (the committed file at the defaults), or for `rules`."""
    groups: list[dict[str, Any]] = yaml.safe_load(rules if rules is not None else render(config or Config()))["groups"]
    alerts = [(g, r) for g in groups for r in g["rules"] if "alert" in r]
    lines = [GENERATED.format(source="the generated rule file (alerts/gpufleet-rules.yml)"), INTRO.format(
        alerts=len(alerts), groups=len(groups), records=sum("record" in r for g in groups for r in g["rules"])),
        table(["severity", "meaning"], [(code(s), meaning) for s, meaning in SEVERITIES.items()]), "\n## Groups\n",
        table(["group", "interval", "alerts", "recording rules"],
              [(code(g["name"]), g.get("interval", "the global evaluation interval"),
                sum("alert" in r for r in g["rules"]), sum("record" in r for r in g["rules"])) for g in groups]),
        "\n## Alerts\n",
        table(["alert", "severity", "for", "group", "summary"],
              [(f"[{r['alert']}](#{r['alert'].lower()})", code(r["labels"]["severity"]), r.get("for", ""),
                code(g["name"]), cell(r["annotations"]["summary"])) for g, r in alerts])]
    for group, rule in alerts:
        lines.append(f"\n### {rule['alert']}\n")
        lines.append(f"{cell(rule['annotations']['summary'])}\n")
        lines.append(f"- severity: `{rule['labels']['severity']}` ({SEVERITIES[rule['labels']['severity']]})")
        lines.append(f"- for: {rule.get('for', 'fires at once')}; group `{group['name']}`, every "
                     f"{group.get('interval', 'evaluation interval')}")
        lines.append(f"- runbook: [{rule['alert']}]({_runbook(rule)})\n")
        lines.append(f"```promql\n{rule['expr'].strip()}\n```")
    lines.append("\n## Recorded series\n")
    lines.append(table(["series", "labels it sets", "group"],
                       [(code(r["record"]), ", ".join(f"{k}={v}" for k, v in r.get("labels", {}).items()),
                         code(g["name"])) for g in groups for r in g["rules"] if "record" in r]))
    return "\n".join(lines)


def _runbook(rule: dict[str, Any]) -> str:
    """The runbook entry on this site: the committed rules link the repository's copy of the same page."""
    return f"../runbooks.md#{rule['alert'].lower()}"


INTRO = """# Alerts

{alerts} alerts and {records} recording rules in {groups} groups, as `gpufleet alerts build` writes them at the
default configuration (a site's own `--config` changes names, selectors, thresholds and windows, never which
alerts exist). Every alert carries `severity`, `summary`, `description` and a `runbook_url` into the
[runbooks](../runbooks.md). The expressions are those Prometheus evaluates, including the clause that holds a
firing alert while its node's exporter is down (see [Alerts](../alerts/index.md)).
"""
