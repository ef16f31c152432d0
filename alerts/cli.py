"""`gpufleet alerts build`: regenerate the committed rule file, or check that it is current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet.alerts import config
from gpufleet.alerts.rules import render

RULES_FILE = Path(__file__).parent / "gpufleet-rules.yml"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("alerts", help="build the Prometheus alerting rules",
                                   description="Generate the Prometheus rules from alerts/rules.py.")
    commands = parser.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)
    build = commands.add_parser("build", help=f"write {RULES_FILE.name}")
    build.add_argument("--check", action="store_true", help="exit 1 if the committed file is out of date")
    build.add_argument("--output", type=Path, default=RULES_FILE, help="where to write (default: %(default)s)")
    config.add_argument(build)
    build.add_argument("--time-scale", type=_time_scale, default=1.0, metavar="FACTOR",
                       help="divide every window and `for` duration by FACTOR, for tests against a fast "
                            "simulated fleet; never for production (default: 1)")
    build.set_defaults(handler=run_build)


def _time_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time scale {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"time scale {text!r} must be from 1 to 1000")
    return value


def run_build(args: argparse.Namespace) -> int:
    text = render(args.config.scaled(args.time_scale))
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"gpufleet alerts build: {args.output} is out of date; run `gpufleet alerts build`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0
