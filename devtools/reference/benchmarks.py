"""The benchmark page: every recorded run of every bench, from bench/results/*.json, newest first."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from gpufleet.devtools import results
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.reference.markdown import GENERATED, cell, code, table

INTRO = """# Benchmarks

Every figure the docs quote comes from a run recorded here: each bench appends its run to
`bench/results/<bench>.json` (what ran, the commit, the machine, the figures), and this page is generated from
those files. Runs marked *transcribed* were printed by their bench before the benches wrote their figures as
data; their figures were copied from that output into the record, with the commit and command of the run.

The machine of most runs is this project's CI-sized one: 2 CPUs, shared with the simulated fleet, so figures
move by a third from one run to the next. A figure near its target is given with the spread of its runs.
"""


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return cell(value if value is not None else "")


def _purpose(bench: str) -> str:
    """The first line of the bench's docstring: what it measures."""
    script = ROOT / "bench" / f"{bench}.py"
    if not script.exists():
        return ""
    docstring = ast.get_docstring(ast.parse(script.read_text())) or ""
    return docstring.splitlines()[0] if docstring else ""


def _run(run: dict[str, Any]) -> str:
    machine = run.get("machine", {})
    where = ", ".join(str(part) for part in (f"{machine.get('cpus')} CPUs" if machine.get("cpus") else "",
                                             machine.get("cpu_model"), f"Python {machine['python']}"
                                             if machine.get("python") else "") if part)
    changed = " (with uncommitted changes)" if run.get("changed") else ""
    kind = " *transcribed*" if run.get("transcribed") else ""
    lines = [f"### {run['date'][:10]}, at {code(run.get('commit', ''))}{changed}{kind}\n",
             f"{code(run['command'])}" + (f" on {where}" if where else "") + "\n"]
    if run.get("notes"):
        lines.append(f"{cell(run['notes'])}\n")
    if run.get("figures"):
        lines.append(table(["figure", "value"], [(name, _value(v)) for name, v in run["figures"].items()]))
    for title, data in run.get("tables", {}).items():
        rows = [[_value(v) for v in row] for row in data["rows"]]
        lines.append(f"\n{cell(title)}:\n\n" + table(data["columns"], rows))
    return "\n".join(lines)


def page(directory: Path = results.RESULTS) -> str:
    sections = [GENERATED.format(source="bench/results/*.json"), INTRO]
    for path in sorted(directory.glob("*.json")):
        bench = path.stem
        sections.append(f"\n## {bench}\n\n{_purpose(bench)}\n")
        sections.extend(_run(run) for run in reversed(results.load(path)))
    return "\n".join(sections)
