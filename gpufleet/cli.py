"""The `gpufleet` command: a thin dispatcher over the packages' own subcommands.

Each package exposes `register(subparsers)`, which adds its subcommand and sets
`handler` on the parsed namespace; this module only wires them together so that
a package can grow its command line without touching the others.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gpufleet import __version__
from gpufleet.alerts import cli as alerts_cli
from gpufleet.dashboards import cli as dashboards_cli
from gpufleet.exporter import cli as exporter_cli
from gpufleet.report import cli as report_cli
from gpufleet.simulator import cli as simulator_cli

_PACKAGES = (exporter_cli, simulator_cli, alerts_cli, dashboards_cli, report_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet", description="Observability for GPU clusters."
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for package in _PACKAGES:
        package.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code
