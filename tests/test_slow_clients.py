"""Slow clients cannot hold the exporter: the connection cap and the header timeout, against the process.

Each slow client below opens a connection and sends half a request's headers, as slowloris does.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
from collections.abc import Iterator

import pytest

from gpufleet.devtools import programs
from gpufleet.devtools.waiting import wait_for

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def exporter(*flags: str) -> Iterator[int]:
    """The exporter's port, once it answers."""
    with programs.exporter(*flags) as server:
        yield int(server.url.rsplit(":", 1)[1])


def scrape(port: int) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return None
    finally:
        connection.close()


def slow_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # ... and never the blank line that ends them.
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed the connection (end of file or reset), without waiting for it."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_connections_beyond_the_cap_close_the_longest_waiting_and_a_scrape_is_still_answered():
    with exporter("--web.max-connections=4", "--web.read-header-timeout=5m") as port:
        held = [slow_client(port) for _ in range(8)]
        try:
            # Each one past the fourth closed the one that had waited longest; no timeout was near.
            wait_for(lambda: [closed_by_server(s) for s in held] == [True] * 4 + [False] * 4, 10,
                     "the four oldest slow clients closed")
            assert scrape(port) == 200
            # The scrape came in while the four newest held every place, and took the oldest one's.
            assert [closed_by_server(s) for s in held[4:]] == [True, False, False, False]
        finally:
            for sock in held:
                sock.close()


def test_headers_that_take_too_long_close_the_connection_and_idle_keep_alive_ones_stay():
    with exporter("--web.read-header-timeout=1s") as port:
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        kept.request("GET", "/metrics")
        first = kept.getresponse()
        first.read()
        address = kept.sock.getsockname()
        slow = slow_client(port)
        try:
            wait_for(lambda: closed_by_server(slow), 15, "the slow client closed at its header timeout")
            # The kept-alive connection sat idle for as long, but sent no half request: it still answers.
            kept.request("GET", "/metrics")
            second = kept.getresponse()
            second.read()
            assert (first.status, second.status) == (200, 200)
            assert kept.sock.getsockname() == address, "the scrape needed a new connection"
        finally:
            slow.close()
            kept.close()
