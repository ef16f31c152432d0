"""`gpufleet report capacity|reliability`: flags, and turning a report's outcome into files and an exit code.

Exit 0 when any section was computed (the failures are listed in the report and on stderr), 1 when
none could be, 2 for bad flags or a Prometheus that cannot be used.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.alerts import config as mixin
from gpufleet.extras import missing
from gpufleet.flags import duration
from gpufleet.report.progress import Progress
from gpufleet.report.prometheus import Auth, Prometheus, Unreachable
from gpufleet.report.query import Window, choose_step

if TYPE_CHECKING:
    from gpufleet.report.document import Report


def _instant(text: str) -> float:
    """RFC 3339 (`2026-11-01T00:00:00Z`) or Unix seconds, as Prometheus's API takes them."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r} (use RFC 3339 or Unix seconds)") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"time {text!r} needs a zone, for example Z or +02:00")
    return moment.timestamp()


def _secret(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror}") from None


_REPORTS = {
    "capacity": "what the fleet has, what it uses, and when it runs out",
    "reliability": "how often the fleet interrupts jobs, why, and how that grows with job size",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("report", help="write reports from Prometheus data",
                                   description="Reports for capacity and reliability planning, from the data "
                                               "Prometheus holds.")
    commands = parser.add_subparsers(dest="report_command", metavar="REPORT", required=True)
    for name, about in _REPORTS.items():
        _flags(commands.add_parser(
            name, help=about,
            description=f"Query Prometheus over a range and write {name}-report.html (self-contained) and "
                        f"{name}-report.md with charts/*.png into --out: {about}."), name)


def _flags(command: argparse.ArgumentParser, name: str) -> None:
    command.add_argument("--prometheus", required=True, metavar="URL",
                         help="Prometheus base URL, e.g. http://prom:9090")
    command.add_argument("--range", dest="length", type=duration, default=duration("30d"), metavar="DURATION",
                         help="length of the period, e.g. 7d, 30d, 12w (default: 30d)")
    command.add_argument("--end", type=_instant, metavar="TIME", help="end of the period (default: now)")
    command.add_argument("--step", type=duration, metavar="DURATION",
                         help="sampling step inside the range (default: range/1440, at least 5m)")
    command.add_argument("--out", type=Path, default=Path(f"{name}-report"), metavar="DIR",
                         help="folder to write into (default: %(default)s)")
    auth = command.add_mutually_exclusive_group()
    auth.add_argument("--prometheus.bearer-token-file", dest="token", type=_secret, metavar="PATH",
                      help="send the token in this file as a bearer token")
    auth.add_argument("--prometheus.username", dest="username", metavar="USER", help="basic auth user")
    command.add_argument("--prometheus.password-file", dest="password", type=_secret, metavar="PATH",
                         help="basic auth password, read from this file")
    command.add_argument("--tls.ca-file", dest="ca_file", metavar="PATH", help="CA bundle to verify Prometheus with")
    command.add_argument("--tls.insecure-skip-verify", dest="verify_tls", action="store_false",
                         help="do not verify Prometheus's TLS certificate")
    command.add_argument("--query.timeout", dest="timeout", type=duration, default=120.0, metavar="DURATION",
                         help="per query (default: 2m)")
    command.add_argument("--query.concurrency", dest="concurrency", type=int, choices=range(1, 33), default=4,
                         metavar="N", help="queries in flight at once, 1 to 32 (default: %(default)s)")
    mixin.add_argument(command)
    command.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="draw a progress bar (default: when stderr is a terminal)")
    command.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    if missing("matplotlib", "reports", f"report {args.report_command}"):
        return 2
    # Here, not at the top: matplotlib takes half a second to import, which every other gpufleet command,
    # the exporter first, would otherwise pay at start and keep in memory.
    from gpufleet.report.capacity import CAPACITY
    from gpufleet.report.reliability import RELIABILITY
    from gpufleet.report.render import write
    from gpufleet.report.run import NothingToReport, build

    spec = {"capacity": CAPACITY, "reliability": RELIABILITY}[args.report_command]

    if args.password is not None and args.username is None:
        print("gpufleet report: --prometheus.password-file needs --prometheus.username", file=sys.stderr)
        return 2
    step = choose_step(args.length, args.step)
    if step > args.length:
        print(f"gpufleet report: --step ({step}s) is longer than --range ({args.length:g}s)", file=sys.stderr)
        return 2
    window = Window.ending(args.end if args.end is not None else time.time(), args.length, step)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    progress = Progress(len(spec.sections), sys.stderr, show)
    client = Prometheus(args.prometheus, Auth(args.token, args.username, args.password), ca_file=args.ca_file,
                        verify_tls=args.verify_tls, timeout=args.timeout, concurrency=args.concurrency)
    started = time.monotonic()

    async def go() -> Report:
        async with client:
            return await build(spec, client, window, progress, args.config)

    try:
        report = asyncio.run(go())
    except (Unreachable, NothingToReport) as error:
        progress.finish()
        print(f"gpufleet report: {error}", file=sys.stderr)
        return 2 if isinstance(error, Unreachable) else 1
    progress.finish()
    for failure in report.failures:
        print(f"gpufleet report: not computed: {failure.title}: {failure.reason}", file=sys.stderr)
    if not report.sections:
        print("gpufleet report: no section could be computed; nothing written", file=sys.stderr)
        return 1
    written = write(report, args.out, f"{spec.name}-report")
    print(f"gpufleet report: wrote {written[-2]} and {written[-1]}: {len(report.sections)} of {len(spec.sections)} "
          f"sections from {progress.queries} queries in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0
