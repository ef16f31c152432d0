"""The HTTP side: /metrics from the cached exposition, a landing page, and /healthz.

Handlers never touch the hardware or wait on a collector; they hand out bytes
the exposition already holds, so a scrape stays fast while a collector hangs.
"""

from __future__ import annotations

import asyncio
import html
import logging
import signal
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gpufleet import __version__
from gpufleet.exporter.connections import ConnectionGuard
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.render import CONTENT_TYPE
from gpufleet.exporter.webconfig import Credentials, WebConfigWatcher

EXPOSITION_KEY: web.AppKey[Exposition] = web.AppKey("exposition", Exposition)


def accepts_gzip(accept_encoding: str) -> bool:
    """True when the client lists gzip without refusing it (`gzip;q=0`)."""
    for entry in accept_encoding.split(","):
        coding, _, params = entry.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            quality = params.strip().removeprefix("q=").strip()
            try:
                return not params.strip() or float(quality) > 0
            except ValueError:
                return False
    return False


async def metrics(request: web.Request) -> web.Response:
    exposition = request.app[EXPOSITION_KEY]
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding", "Cache-Control": "no-store"}
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=exposition.gzipped(), headers=headers)
    return web.Response(body=exposition.body(), headers=headers)


async def landing(request: web.Request) -> web.Response:
    rows = "".join(
        f"<tr><td>{html.escape(c.name)}</td><td>{'ok' if c.state.success else 'failing'}</td>"
        f"<td>{c.interval:g}s</td></tr>"
        for c in request.app[EXPOSITION_KEY].collectors
    )
    page = (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>gpufleet exporter</title></head><body>"
        f"<h1>gpufleet exporter {html.escape(__version__)}</h1>"
        "<p><a href=\"metrics\">Metrics</a> &middot; <a href=\"healthz\">Health</a></p>"
        f"<table><tr><th>collector</th><th>last collection</th><th>interval</th></tr>{rows}</table>"
        "</body></html>"
    )
    return web.Response(text=page, content_type="text/html")


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the event loop answers. Collector health is in the metrics, where alerts can see it."""
    return web.Response(text="ok\n")


def _limit(max_requests: int) -> Middleware:
    """Answer 503 at once beyond `max_requests` concurrent requests, as node_exporter's --web.max-requests."""
    in_flight = 0

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal in_flight
        if in_flight >= max_requests:
            return web.Response(status=503, text="too many concurrent requests\n")
        in_flight += 1
        try:
            return await handler(request)
        finally:
            in_flight -= 1

    return limit


def secure(watcher: WebConfigWatcher) -> Middleware:
    """Basic auth and response headers from the current web configuration (the remediator's too)."""
    credentials = Credentials()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        config = watcher.current
        if config.users:
            header = request.headers.get("Authorization", "")
            # bcrypt takes tens of milliseconds: off the event loop, so other scrapes are not held up.
            if not header or not await asyncio.to_thread(credentials.check, config.users, header):
                return web.Response(status=401, text="unauthorized\n",
                                    headers={"WWW-Authenticate": 'Basic realm="gpufleet"', **config.headers})
        response = await handler(request)
        response.headers.update(config.headers)
        return response

    return guard


def build_app(exposition: Exposition, web_config: WebConfigWatcher | None = None,
              max_requests: int = 0, connections: ConnectionGuard | None = None) -> web.Application:
    middlewares: list[Middleware] = []
    if connections is not None:  # Outermost: a connection is busy for the whole of a request.
        middlewares.append(connections.middleware())
    if max_requests > 0:
        middlewares.append(_limit(max_requests))
    if web_config is not None:
        middlewares.append(secure(web_config))
    app = web.Application(middlewares=middlewares)
    app[EXPOSITION_KEY] = exposition
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", landing)
    app.router.add_get("/healthz", healthz)
    return app


async def serve_until_signalled(app: web.Application, host: str | None, port: int,
                                background: Callable[[], Sequence[Coroutine[Any, Any, None]]],
                                ready: Callable[[], None], log: logging.Logger,
                                shutdown_timeout: float = 60.0, ssl_context: ssl.SSLContext | None = None,
                                connections: ConnectionGuard | None = None) -> None:
    """Serve `app` and run `background()` tasks until SIGINT or SIGTERM, then stop both cleanly.

    The listening socket opens before any background task starts, so a port already in use fails
    at once (OSError) with nothing to undo. With `connections`, every connection goes through that
    guard (and `app` must have been built with it); a TLS handshake gets the same time as the headers.
    """
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    server = runner.server
    assert server is not None

    def protocol() -> asyncio.Protocol:
        return server() if connections is None else connections.protocol(server())

    loop = asyncio.get_running_loop()
    tls: dict[str, Any] = {}
    if ssl_context is not None:
        tls = {"ssl": ssl_context}
        if connections is not None:
            tls["ssl_handshake_timeout"] = connections.header_timeout
    listener = None
    try:
        listener = await loop.create_server(protocol, host, port, **tls)
        ready()
        tasks = [asyncio.create_task(coroutine) for coroutine in background()]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("shutting down")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()
