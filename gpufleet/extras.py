"""The optional parts of the install: the exporter's dependencies are the package's own, so that a GPU node
installs nothing it does not run; the dashboards builder and the reports come with extras of their own."""

from __future__ import annotations

import importlib.util
import sys


def missing(module: str, extra: str, command: str) -> bool:
    """Whether `module` is not installed, having then said on stderr, in one line, which extra brings it."""
    if importlib.util.find_spec(module) is not None:
        return False
    print(f"gpufleet {command}: needs the {extra} extra, which is not installed: pip install 'gpufleet[{extra}]'",
          file=sys.stderr)
    return True
