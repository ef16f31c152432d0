"""`gpufleet dashboards build`: render every `*.dashboard.py` to the committed JSON, or check it is current."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet import checkout
from gpufleet.alerts import config as mixin
from gpufleet.extras import missing

if TYPE_CHECKING:
    from grafanalib.core import Dashboard

SOURCES = Path(__file__).parent
OUTPUT = SOURCES / "json"  # The packaged copy, read by the tests; a build writes into the checkout.


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("dashboards", help="build the Grafana dashboards",
                                   description="Generate the Grafana dashboards from dashboards/*.dashboard.py.")
    commands = parser.add_subparsers(dest="dashboards_command", metavar="COMMAND", required=True)
    build = commands.add_parser("build", help="write dashboards/json/*.json")
    build.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is out of date")
    build.add_argument("--output", type=Path, metavar="DIR",
                       help="directory to write (default: dashboards/json of the checkout this runs in)")
    mixin.add_argument(build)
    build.set_defaults(handler=run_build)


def load(path: Path, config: mixin.Config) -> Dashboard:
    """What `build(config)` of one `*.dashboard.py` returns (a name with a dot, so not importable as usual)."""
    spec = importlib.util.spec_from_file_location(f"gpufleet_dashboard_{path.stem.split('.')[0]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model: Dashboard = module.build(config)
    return model


def _json_data(value: object) -> object:
    """What grafanalib objects nested in a model serialise to: the same hook its own encoder calls."""
    to_json_data = getattr(value, "to_json_data", None)
    if to_json_data is None:
        raise TypeError(f"{type(value).__name__} is not part of a Grafana model")
    return to_json_data()


def rendered(config: mixin.Config | None = None) -> dict[str, str]:
    """File name to JSON text, for every dashboard, in the stable form that is committed (at the defaults)."""
    files = {}
    for path in sorted(SOURCES.glob("*.dashboard.py")):
        model = load(path, config or mixin.Config()).to_json_data()
        files[f"{model['uid']}.json"] = json.dumps(model, sort_keys=True, indent=2, default=_json_data) + "\n"
    return files


def write(directory: Path, files: dict[str, str], check: bool) -> list[str]:
    """Make `directory` hold exactly `files` (name to text), or with `check` only compare; returns the names that
    differ, were missing or were left over."""
    current = {p.name: p.read_text(encoding="utf-8") for p in directory.glob("*.json")}
    stale = sorted(name for name in set(current) | set(files) if current.get(name) != files.get(name))
    if not check:
        directory.mkdir(parents=True, exist_ok=True)
        for name in set(current) - set(files):
            (directory / name).unlink()
        for name in stale:
            if name in files:
                (directory / name).write_text(files[name], encoding="utf-8")
    return stale


def run_build(args: argparse.Namespace) -> int:
    if missing("grafanalib", "dashboards", "dashboards build"):
        return 2
    directory = checkout.directory(args.output, "dashboards/json", "dashboards build")
    if directory is None:
        return 2
    stale = write(directory, rendered(args.config), args.check)
    if args.check and stale:
        print(f"gpufleet dashboards build: out of date: {', '.join(stale)}; run `gpufleet dashboards build`",
              file=sys.stderr)
        return 1
    return 0
