"""The node_exporter reference: each of gpufleet's node-level series and node_exporter's name for the same
reading, and what each side has that the other has not."""

from __future__ import annotations

import re

from gpufleet.alerts import node_exporter
from gpufleet.devtools.paths import FIXTURES
from gpufleet.devtools.reference.markdown import GENERATED, code, table

INTRO = """# node_exporter names

Beside node_exporter (`node_exporter_job` in the configuration), the rules, dashboards and reports read node_exporter
1.5's series in place of these of gpufleet's, and the exporter runs with `{flags}`. How to set it up, and what
differs, is in [Beside node_exporter](../exporter/node-exporter.md).
"""

# Series of the overlapping collectors that node_exporter 1.5 does not export, and so are gone beside it.
_GONE = {
    "network": "node_exporter's `netdev` reads /proc/net/dev, which has no such column",
    "thermal_zone": "node_exporter's `thermal_zone` reads zone temperatures only",
}


def ours_only() -> list[str]:
    """The golden exposition's series of the overlapping collectors that have no node_exporter name."""
    golden = (FIXTURES / "e2e-output.txt").read_text(encoding="utf-8")
    prefixes = tuple(f"gpufleet_{collector}_" for collector in node_exporter.COLLECTORS_OFF)
    names = set(re.findall(r"^# TYPE (\S+) ", golden, re.M))
    return sorted(name for name in names if name.startswith(prefixes) and name not in node_exporter.NAMES)


def page() -> str:
    renamed = [(code(ours), code(theirs)) for ours, theirs in sorted(node_exporter.NAMES.items())]
    kept = [(code(name), why) for name, why in node_exporter.KEPT.items()]
    gone = [(code(name), _GONE[next(c for c in _GONE if name.startswith(f"gpufleet_{c}_"))]) for name in ours_only()]
    return "\n".join([
        GENERATED.format(source="alerts/node_exporter.py"),
        INTRO.format(flags=" ".join(node_exporter.EXPORTER_FLAGS)),
        "## Renamed\n", table(["gpufleet series", "node_exporter series"], renamed),
        "\n## Kept from gpufleet's infiniband collector\n",
        "node_exporter has no such reading; `--collector.infiniband.beside-node-exporter` exports these alone.\n",
        table(["gpufleet series", "why"], kept),
        "\n## Not read beside node_exporter\n",
        "gpufleet's collector exports these and node_exporter does not; no rule, dashboard or report reads them.\n",
        table(["gpufleet series", "why"], gone),
    ])
