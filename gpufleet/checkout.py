"""The gpufleet checkout a command runs in: where the builders write what they generate by default.

An installed package is never written to: run outside a checkout, a builder needs to be told where to write.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def find(start: Path | None = None) -> Path | None:
    """The closest directory at or above `start` (the working directory) that holds gpufleet's pyproject.toml."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        project = directory / "pyproject.toml"
        if project.is_file():
            try:
                name = tomllib.loads(project.read_text(encoding="utf-8")).get("project", {}).get("name")
            except (OSError, tomllib.TOMLDecodeError):
                continue
            if name == "gpufleet":
                return directory
    return None


def directory(given: Path | None, relative: str, command: str) -> Path | None:
    """Where a builder writes: `given`, or `relative` in the checkout this runs in; None outside one, having said
    on stderr that `--output` is needed."""
    if given is not None:
        return given
    root = find()
    if root is None:
        print(f"gpufleet {command}: not in a gpufleet checkout; give --output DIR", file=sys.stderr)
        return None
    return root / relative
