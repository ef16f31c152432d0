"""The `gpufleet` command: a thin dispatcher over the packages' own subcommands.

Each package exposes `register(subparsers)`, which adds its subcommand and sets
`handler` on the parsed namespace; this module only wires them together so that
a package can grow its command line without touching the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpufleet import __version__

# Each subcommand and the module that registers it. Only the one named on the command line is imported: the
# exporter runs on every node for months, and the other packages' command lines would add about 3 MiB to its
# memory, the simulator's fleet model most of it.
COMMANDS = {
    "exporter": "gpufleet.exporter.cli",
    "simulate": "gpufleet.simulator.cli",
    "alerts": "gpufleet.alerts.cli",
    "dashboards": "gpufleet.dashboards.cli",
    "report": "gpufleet.report.cli",
    "deploy": "gpufleet.deploy.cli",
    "remediate": "gpufleet.remediate.cli",
    "maintenance": "gpufleet.alerts.silences",
}


def build_parser(command: str = "") -> argparse.ArgumentParser:
    """The parser of `command` alone where it names a subcommand; otherwise of them all, for help and errors."""
    parser = argparse.ArgumentParser(
        prog="gpufleet", description="Observability for GPU clusters."
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [command] if command in COMMANDS else list(COMMANDS):
        importlib.import_module(COMMANDS[name]).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else "").parse_args(argv)
    code: int = args.handler(args)
    return code
