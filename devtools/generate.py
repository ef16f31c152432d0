"""Everything generated from the code, in one place: what `python -m gpufleet.devtools generate` writes and what
its `--check` (and the test of it) compares.

Each artifact renders the files it owns, by path relative to the checkout's root. A directory it owns
(the dashboards' JSON) holds exactly what it renders: a file left there from a dashboard that is gone is stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.alerts.cli import COMMITTED
from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.dashboards.cli import rendered as dashboards
from gpufleet.deploy.cli import render as kubernetes
from gpufleet.devtools.costmodel import calls_text
from gpufleet.devtools.nodes import golden_exposition
from gpufleet.devtools.reference import alerts, benchmarks, dcgm, flags, metrics, node_exporter


@dataclass(frozen=True)
class Artifact:
    name: str
    render: Callable[[], dict[str, str]]  # Relative path to text.
    # A directory (relative) and a glob of the files below it (`*.json`, `**/*.yaml`) that holds only these.
    owns: str | None = None


ARTIFACTS = (
    Artifact("rules", lambda: {f"alerts/{name}": render(Config(), engine, layer)
                               for (engine, layer), name in COMMITTED.items()}),
    Artifact("dashboards", lambda: {f"dashboards/json/{name}": text for name, text in dashboards().items()},
             owns="dashboards/json/*.json"),
    Artifact("kubernetes", lambda: {f"deploy/kubernetes/{name}": text for name, text in kubernetes(Config()).items()},
             owns="deploy/kubernetes/**/*.yaml"),
    Artifact("golden", lambda: {"tests/fixtures/e2e-output.txt": golden_exposition()}),
    Artifact("nvml calls", lambda: {"tests/fixtures/nvml-calls.txt": calls_text()}),
    Artifact("flags", lambda: {"docs/reference/flags.md": flags.page()}),
    Artifact("metrics", lambda: {"docs/reference/metrics.md": metrics.page()}),
    Artifact("alerts", lambda: {"docs/reference/alerts.md": alerts.page()}),
    Artifact("dcgm", lambda: {"docs/reference/dcgm-exporter.md": dcgm.page()}),
    Artifact("node_exporter", lambda: {"docs/reference/node-exporter.md": node_exporter.page()}),
    Artifact("benchmarks", lambda: {"docs/benchmarks.md": benchmarks.page()}),
)


def stale(root: Path, artifact: Artifact, files: dict[str, str]) -> list[str]:
    """The paths whose committed text differs from `files`, is missing, or is left over in an owned directory."""
    differing = [path for path, text in files.items()
                 if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text]
    if artifact.owns:
        parts = artifact.owns.split("/")
        cut = next(index for index, part in enumerate(parts) if "*" in part)
        held = sorted((root / "/".join(parts[:cut])).glob("/".join(parts[cut:])))
        differing += [path for path in (p.relative_to(root).as_posix() for p in held) if path not in files]
    return sorted(differing)


def generate(root: Path, check: bool, only: tuple[str, ...] = ()) -> list[str]:
    """Render every artifact (or those named in `only`); write what changed unless `check`. Returns the paths
    that were stale."""
    found = []
    for artifact in ARTIFACTS:
        if only and artifact.name not in only:
            continue
        files = artifact.render()
        changed = stale(root, artifact, files)
        found += changed
        if check:
            continue
        for path in changed:
            target = root / path
            if path in files:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(files[path], encoding="utf-8")
            else:
                target.unlink()
    return found
