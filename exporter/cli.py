"""`gpufleet exporter`: flags, start-up checks and the serving loop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from gpufleet.exporter import node
from gpufleet.exporter.collector import CollectorError
from gpufleet.exporter.connections import ConnectionGuard
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.server import build_app, serve_until_signalled
from gpufleet.exporter.state import PersistentState
from gpufleet.exporter.webconfig import WebConfigError, WebConfigWatcher
from gpufleet.flags import duration, listen_address, non_negative_int
from gpufleet.logfmt import configure_logging

DEFAULT_LISTEN_ADDRESS = ":19400"
# A few Prometheus servers and agents keep a connection each; a hundred is room for them and for people.
DEFAULT_MAX_CONNECTIONS = 100
DEFAULT_READ_HEADER_TIMEOUT = 10.0  # A scraper sends its headers at once; Prometheus's scrape timeout is 10 s.

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "exporter",
        help="run the per-node exporter",
        description="Collect GPU, NIC and thermal metrics on this node and serve them on /metrics.",
    )
    parser.add_argument("--web.listen-address", dest="listen_address", type=listen_address,
                        default=DEFAULT_LISTEN_ADDRESS, metavar="HOST:PORT",
                        help="address to serve /metrics on (default: %(default)s)")
    parser.add_argument("--web.config.file", dest="web_config", metavar="PATH",
                        help="TLS, basic auth and headers, in the Prometheus exporter-toolkit format")
    parser.add_argument("--web.max-requests", dest="max_requests", type=int, default=40, metavar="N",
                        help="concurrent requests beyond which the exporter answers 503 at once; 0 for no limit "
                             "(default: %(default)s)")
    parser.add_argument("--web.max-connections", dest="max_connections", type=non_negative_int,
                        default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                        help="open connections at most; beyond, the one that has waited longest for a request is "
                             "closed; 0 for no limit (default: %(default)s)")
    parser.add_argument("--web.read-header-timeout", dest="read_header_timeout", type=duration,
                        default=DEFAULT_READ_HEADER_TIMEOUT, metavar="DURATION",
                        help="close a connection whose request headers take longer than this (default: %(default)gs)")
    parser.add_argument("--log.level", dest="log_level", choices=("debug", "info", "warn", "error"), default="info",
                        help="least severe log level written (default: %(default)s)")
    node.add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    web_config = None
    if args.web_config:
        try:
            web_config = WebConfigWatcher(args.web_config)
        except WebConfigError as err:
            print(f"gpufleet exporter: error: --web.config.file: {err}", file=sys.stderr)
            return 1
    try:
        hardware = node.hardware(args)
        collectors = node.build(args, hardware)
    except CollectorError as err:
        print(f"gpufleet exporter: error: {err}", file=sys.stderr)
        return 1
    try:
        host, port = args.listen_address
        connections = ConnectionGuard(args.max_connections, args.read_header_timeout)
        asyncio.run(serve(collectors, host, port, web_config, args.max_requests, connections, hardware.state))
    except OSError as err:
        print(f"gpufleet exporter: error: cannot listen on {args.listen_address[0] or '*'}:{args.listen_address[1]}: "
              f"{err.strerror or err}", file=sys.stderr)
        return 1
    finally:
        node.close(collectors)
    return 0


async def serve(collectors: Sequence[ScheduledCollector], host: str | None, port: int,
                web_config: WebConfigWatcher | None = None, max_requests: int = 0,
                connections: ConnectionGuard | None = None, state: PersistentState | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then stop the collectors' tasks and the server."""

    def background() -> list[Coroutine[Any, Any, None]]:
        for collector in collectors:
            collector.start()
        tasks = [c.run() for c in collectors]
        if web_config is not None:
            tasks.append(web_config.watch())
        return tasks

    await serve_until_signalled(
        build_app(Exposition(collectors, state=state), web_config, max_requests, connections), host, port,
        background=background,
        ready=lambda: log.info("listening on %s:%d%s with collectors %s", host or "*", port,
                               " (TLS)" if web_config and web_config.current.ssl_context else "",
                               ", ".join(c.name for c in collectors)),
        log=log,
        ssl_context=web_config.current.ssl_context if web_config else None,
        connections=connections,
    )
