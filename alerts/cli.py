"""`gpufleet alerts build`: regenerate the committed rule files, or check that they are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet.alerts import config
from gpufleet.alerts.rules import ENGINES, Engine, render

RULES_FILE = Path(__file__).parent / "gpufleet-rules.yml"
VMALERT_RULES_FILE = Path(__file__).parent / "gpufleet-vmalert-rules.yml"
COMMITTED: dict[Engine, Path] = {"prometheus": RULES_FILE, "vmalert": VMALERT_RULES_FILE}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("alerts", help="build the Prometheus and vmalert rules",
                                   description="Generate the alerting and recording rules from alerts/rules.py.")
    commands = parser.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)
    build = commands.add_parser("build", help=f"write {RULES_FILE.name} and {VMALERT_RULES_FILE.name}")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if a file it would write is out of date")
    build.add_argument("--engine", choices=ENGINES,
                       help="build for this evaluator only (default: both committed files, or prometheus with "
                            "--output); vmalert's file adds each group's `concurrency`, which Prometheus refuses")
    build.add_argument("--output", type=Path, metavar="FILE",
                       help=f"write one file here instead of {RULES_FILE.name} and {VMALERT_RULES_FILE.name} "
                            "beside the code")
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


def targets(engine: Engine | None, output: Path | None) -> dict[Engine, Path]:
    """Where each engine's file goes: --output names one file (Prometheus's unless --engine says otherwise)."""
    if output is not None:
        return {engine or "prometheus": output}
    return {e: path for e, path in COMMITTED.items() if engine in (None, e)}


def run_build(args: argparse.Namespace) -> int:
    scaled = args.config.scaled(args.time_scale)
    stale = 0
    for engine, path in targets(args.engine, args.output).items():
        text = render(scaled, engine)
        if not args.check:
            path.write_text(text, encoding="utf-8")
        elif (path.read_text(encoding="utf-8") if path.exists() else "") != text:
            print(f"gpufleet alerts build: {path} is out of date; run `gpufleet alerts build`", file=sys.stderr)
            stale = 1
    return stale
