"""`gpufleet remediate`: flags, start-up checks and the serving loop of the remediator."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gpufleet.flags import duration, listen_address, number_in, positive_int, regex
from gpufleet.logfmt import configure_logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "remediate", help="drain and resume Slurm nodes from Alertmanager's webhook",
        description="Drain the Slurm node of a GPU that needs a reset or a reboot, and resume it once the repair "
                    "is seen and the site's check passes. Dry run unless --no-dry-run.")
    add = parser.add_argument
    add("--web.listen-address", dest="listen_address", type=listen_address, default=":19410", metavar="HOST:PORT",
        help="address of /webhook, /metrics and /-/breaker/close (default: %(default)s)")
    add("--web.config.file", dest="web_config", metavar="PATH",
        help="TLS, client certificates, basic auth and headers, in the exporter's web-config format")
    add("--web.token-file", dest="token_file", type=Path, metavar="PATH",
        help="file holding the bearer token that /webhook and /-/breaker/close require")
    add("--dry-run", action=argparse.BooleanOptionalAction, default=True,
        help="log and count what it would do, change nothing in Slurm (default: on; --no-dry-run acts)")
    add("--breaker.max-nodes", dest="max_nodes", type=positive_int, default=4, metavar="N",
        help="drains in a sliding hour past which the breaker stops every drain (default: %(default)s)")
    add("--breaker.max-share", dest="max_share", type=number_in("share", 0, 1), default=0.1, metavar="SHARE",
        help="share of a partition drained in a sliding hour past which the breaker opens (default: %(default)s)")
    add("--check.command", dest="check_command", metavar="COMMAND",
        help="run before resuming a node, {node} its name; a non-zero exit keeps it drained (default: none)")
    add("--check.timeout", dest="check_timeout", type=duration, default=600.0, metavar="DURATION",
        help="a check running longer fails (default: %(default)gs)")
    add("--slurm.scontrol", dest="scontrol", default="scontrol", metavar="PATH", help="the scontrol command")
    add("--slurm.timeout", dest="slurm_timeout", type=duration, default=20.0, metavar="DURATION",
        help="a Slurm call taking longer is tried again later (default: %(default)gs)")
    add("--slurm.list-interval", dest="list_interval", type=duration, default=30.0, metavar="DURATION",
        help="how often Slurm's node list (states, reasons, maintenance) is read again (default: %(default)gs)")
    add("--slurm.retry-max", dest="retry_max", type=duration, default=300.0, metavar="DURATION",
        help="longest wait between tries of one action while Slurm fails (default: %(default)gs)")
    add("--node.label", dest="node_label", default="instance", metavar="LABEL",
        help="the alert label naming the node (default: %(default)s)")
    add("--node.pattern", dest="node_pattern", type=regex, default=re.compile(r"^(?P<node>[^:]+)"), metavar="REGEX",
        help="its group `node` in that label is the Slurm node name (default: the label up to a port)")
    add("--state.file", dest="state_file", type=Path, metavar="PATH",
        help="where nodes held, drains of the hour and the breaker survive restarts (default: memory only)")
    add("--audit.file", dest="audit_file", type=Path, metavar="PATH",
        help="append one JSON line per decision, with the alerts behind it (default: the log only)")
    add("--interval", type=duration, default=10.0, metavar="DURATION",
        help="how often the nodes held are judged again, besides at each webhook (default: %(default)gs)")
    add("--log.level", dest="log_level", choices=("debug", "info", "warn", "error"), default="info",
        help="least severe log level written (default: %(default)s)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.exporter.server import serve_until_signalled
    from gpufleet.exporter.webconfig import WebConfigError, WebConfigWatcher
    from gpufleet.remediate.check import Check
    from gpufleet.remediate.engine import Remediator, Settings
    from gpufleet.remediate.server import Webhooks, build_app
    from gpufleet.remediate.slurm import Slurm
    from gpufleet.remediate.state import StateFile

    configure_logging(args.log_level)
    if "node" not in args.node_pattern.groupindex:
        print("gpufleet remediate: error: --node.pattern needs a group named node: (?P<node>...)", file=sys.stderr)
        return 2
    try:
        web_config = WebConfigWatcher(args.web_config) if args.web_config else None
        check = Check(args.check_command, args.check_timeout) if args.check_command else None
    except (WebConfigError, ValueError) as err:
        print(f"gpufleet remediate: error: {err}", file=sys.stderr)
        return 2
    if args.token_file is not None and not args.token_file.is_file():
        print(f"gpufleet remediate: error: --web.token-file {args.token_file}: no such file", file=sys.stderr)
        return 2
    settings = Settings(dry_run=args.dry_run, max_nodes=args.max_nodes, max_share=args.max_share,
                        retry_max=args.retry_max)
    host, port = args.listen_address

    async def main() -> None:
        remediator = Remediator(Slurm(args.scontrol, args.slurm_timeout), settings, check,
                                StateFile(args.state_file), args.audit_file)
        webhooks = Webhooks(remediator, args.node_label, args.node_pattern, args.token_file)

        def background() -> list[Coroutine[Any, Any, None]]:  # Certificates rotate without a restart.
            return [remediator.run(args.interval, args.list_interval), *([web_config.watch()] if web_config else [])]

        await serve_until_signalled(
            build_app(webhooks, web_config), host, port, background=background, log=log,
            ready=lambda: log.info("listening on %s:%d%s; %s; breaker at %d nodes or %.0f%% of a partition an hour",
                                   host or "*", port, " (TLS)" if web_config and web_config.current.ssl_context
                                   else "", "DRY RUN: nothing is changed in Slurm" if settings.dry_run else "acting",
                                   settings.max_nodes, settings.max_share * 100),
            ssl_context=web_config.current.ssl_context if web_config else None)

    try:
        asyncio.run(main())
    except OSError as err:
        print(f"gpufleet remediate: error: cannot listen on {host or '*'}:{port}: {err.strerror or err}",
              file=sys.stderr)
        return 1
    return 0
