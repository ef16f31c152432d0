"""Ports and HTTP on loopback, with nothing but the standard library."""

from __future__ import annotations

import json
import random
import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int, attempts: int = 50) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1 that were free a moment ago: the simulator's probe
    ports, one per node. Drawn from the range above the ephemeral ports the kernel hands out."""
    for _ in range(attempts):
        first = random.randrange(20000, 32000 - count)
        socks = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise OSError(f"no {count} consecutive free ports on 127.0.0.1 after {attempts} tries")


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def http(method: str, url: str, body: object = None, timeout: float = 5.0, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, bytes]:
    """The status and body of one request (`body` sent as JSON, or `raw` bytes as they are); an HTTP error status
    is returned, not raised."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status: int = response.status
            return status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def get(url: str, timeout: float = 10.0) -> bytes:
    """The body of a GET that must succeed: an HTTP error status raises urllib's HTTPError."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body
