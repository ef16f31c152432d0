"""Slow or idle clients cannot hold the exporter: a deadline for request headers, and a cap on connections.

A scrape sends its few hundred bytes of headers at once. A client that opens connections and
trickles its headers (slowloris), or opens them and sends nothing, would otherwise keep each one
open for as long as it likes, until the process runs out of file descriptors and Prometheus cannot
connect. Two limits, as `--web.read-header-timeout` and `--web.max-connections`:

* a connection must deliver a request's headers within the header timeout, counted from its first
  byte (from the connection's opening, for its first request); one that does not is closed;
* at most `limit` connections are open. A new connection beyond the cap closes the open one that has
  waited longest for a request (slow or idle), so a normal scrape always gets in; only when every
  open connection is in the middle of a request is the new one closed instead.

Idle keep-alive connections between scrapes are not timed here (aiohttp's keep-alive timeout
closes them), but they are the first to go when the cap is reached.
"""

from __future__ import annotations

import asyncio
from enum import Enum

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware


class _State(Enum):
    IDLE = "idle"  # Between requests: nothing of the next one has arrived.
    READING = "reading"  # Part of a request's headers has arrived, the rest has not.
    BUSY = "busy"  # The headers are in and a handler is answering.


class _GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its state tracked for the guard."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.admitted = False
        self.state = _State.IDLE
        self.since = 0.0  # When the connection entered its state.
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.admitted = self.guard.admit(self)
        if not self.admitted:
            transport.abort()
            return
        self.inner.connection_made(transport)
        self._enter(_State.IDLE, timed=True)  # Its first request must start, and end its headers, in time.

    def data_received(self, data: bytes) -> None:
        if self.state is _State.IDLE:
            waiting_since = self.since
            self._enter(_State.READING, timed=self._deadline is None)
            # Headers trickling in do not make a connection younger: it has waited for a request since it went
            # idle, so which one the cap closes does not depend on whether its bytes were read yet.
            self.since = waiting_since
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.guard.forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def request_started(self) -> None:
        self._cancel_deadline()
        self._enter(_State.BUSY, timed=False)

    def request_finished(self) -> None:
        self._enter(_State.IDLE, timed=False)  # Idle between requests: aiohttp's keep-alive timeout applies.

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _enter(self, state: _State, timed: bool) -> None:
        loop = asyncio.get_running_loop()
        self.state, self.since = state, loop.time()
        if timed:
            self._cancel_deadline()
            self._deadline = loop.call_later(self.guard.header_timeout, self.close)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class ConnectionGuard:
    """The open connections of one server, and the two limits on them."""

    def __init__(self, limit: int, header_timeout: float) -> None:
        self.limit = limit  # 0: no cap.
        self.header_timeout = header_timeout
        self._open: set[_GuardedConnection] = set()

    def protocol(self, inner: asyncio.Protocol) -> asyncio.Protocol:
        return _GuardedConnection(self, inner)

    def admit(self, connection: _GuardedConnection) -> bool:
        """Make room for a new connection, closing the one that has waited longest for a request if need be."""
        if self.limit and len(self._open) >= self.limit:
            waiting = [c for c in self._open if c.state is not _State.BUSY]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c.since)
            self._open.discard(oldest)
            oldest.close()
        self._open.add(connection)
        return True

    def forget(self, connection: _GuardedConnection) -> None:
        self._open.discard(connection)

    def middleware(self) -> Middleware:
        """Marks each connection busy while a handler answers one of its requests."""

        @web.middleware
        async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            connection = transport.get_protocol() if transport is not None else None
            if not isinstance(connection, _GuardedConnection):
                return await handler(request)
            connection.request_started()
            try:
                return await handler(request)
            finally:
                connection.request_finished()

        return track
