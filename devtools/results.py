"""Benchmark figures as data: each run of a bench appends one record to `bench/results/<bench>.json`, which the
benchmark page is generated from (`python -m gpufleet.devtools generate`).

A record says what ran (the command, the commit and whether the tree had changes), where (the machine and
the interpreter) and when, and holds its figures: single `figures` (name to value, with units in the names)
and `tables` (a title to columns and rows). The docs quote figures from these files, never from a run typed
out by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpufleet.devtools.paths import ROOT

RESULTS = ROOT / "bench" / "results"
Value = float | int | str | None


@dataclass
class Table:
    """Rows of figures under named columns, such as a rule group's p50 and p99 per group."""

    columns: list[str]
    rows: list[list[Value]] = field(default_factory=list)

    def add(self, *row: Value) -> None:
        if len(row) != len(self.columns):
            raise ValueError(f"a row of {len(row)} cells under {len(self.columns)} columns")
        self.rows.append(list(row))


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def machine() -> dict[str, Value]:
    """What the figures depend on besides the code: CPUs, memory, kernel, interpreter."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), "")
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "implementation": platform.python_implementation()}


def record(bench: str, figures: Mapping[str, Value], tables: Mapping[str, Table] | None = None,
           argv: Sequence[str] | None = None, notes: str = "", path: Path | None = None) -> Path:
    """Append this run's record to the bench's results file (or `path`), and return where it went."""
    path = path or RESULTS / f"{bench}.json"
    entry: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "changed": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!docs")),
        "command": " ".join(["python", f"bench/{bench}.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "figures": dict(figures),
        "tables": {title: {"columns": t.columns, "rows": t.rows} for title, t in (tables or {}).items()},
    }
    if notes:
        entry["notes"] = notes
    append(bench, [entry], path)
    print(f"figures appended to {path}", file=sys.stderr)
    return path


def append(bench: str, runs: Sequence[dict[str, Any]], path: Path) -> None:
    """Add `runs` after those the results file at `path` holds already."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": bench, "runs": [*load(path), *runs]}, indent=1) + "\n")


def load(path: Path) -> list[dict[str, Any]]:
    """The runs a results file holds, oldest first; none for a file that is not there yet."""
    if not path.exists():
        return []
    runs: list[dict[str, Any]] = json.loads(path.read_text())["runs"]
    return runs


def add_argument(parser: argparse.ArgumentParser) -> None:
    """`--results FILE`: where a bench appends its record (default: bench/results/<bench>.json)."""
    parser.add_argument("--results", type=Path, metavar="FILE",
                        help="append this run's figures here instead of bench/results/<bench>.json")
