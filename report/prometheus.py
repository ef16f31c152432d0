"""A small client for the Prometheus HTTP API, with the errors a report can explain to its reader.

Reports run from a laptop or a cron job against a Prometheus behind a proxy, so the client takes
bearer tokens and basic auth, verifies TLS unless told not to, and turns every failure into one
of two errors: the server cannot be used at all (`Unreachable`), or one query failed
(`QueryFailed`) and the sections that need it say so.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp


class Unreachable(Exception):
    """Prometheus could not be asked anything: connection, TLS, authentication or a non-Prometheus reply."""


class QueryFailed(Exception):
    """Prometheus answered one query with an error (bad expression, too many samples, timeout)."""


@dataclass(frozen=True)
class Auth:
    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None

    def headers(self) -> dict[str, str]:
        if self.bearer_token:
            return {"Authorization": f"Bearer {self.bearer_token}"}
        if self.username is not None:
            pair = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    values: list[tuple[float, float]]


class Prometheus:
    """Instant and range queries; at most `concurrency` in flight so a large report cannot swamp the server."""

    def __init__(self, url: str, auth: Auth = Auth(), *, ca_file: str | None = None, verify_tls: bool = True,
                 timeout: float = 120.0, concurrency: int = 4) -> None:
        self.url = url.rstrip("/")
        self._auth = auth
        self._timeout = timeout
        self._limit = asyncio.Semaphore(concurrency)
        if not verify_tls:
            self._ssl: ssl.SSLContext | bool = False
        else:
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Prometheus:
        self._session = aiohttp.ClientSession(
            headers=self._auth.headers(),
            timeout=aiohttp.ClientTimeout(total=self._timeout, connect=min(10.0, self._timeout)))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, path: str, params: dict[str, str], post: bool = False) -> Any:
        """Queries go as POST bodies: a report's expressions outgrow a URL that a proxy accepts."""
        assert self._session is not None, "use `async with Prometheus(...)`"
        url = f"{self.url}{path}"
        async with self._limit:
            try:
                request = self._session.post(url, data=params, ssl=self._ssl) if post else \
                    self._session.get(url, params=params, ssl=self._ssl)
                async with request as reply:
                    return await self._decode(url, reply)
            except aiohttp.ClientConnectorCertificateError as error:
                raise Unreachable(f"TLS certificate of {self.url} not trusted: {error.certificate_error}; "
                                  "pass --tls.ca-file, or --tls.insecure-skip-verify to skip the check") from None
            except aiohttp.ClientConnectorError as error:
                raise Unreachable(f"cannot connect to Prometheus at {self.url}: {error.os_error or error}") from None
            except aiohttp.InvalidURL:
                raise Unreachable(f"not a URL: {self.url!r}") from None
            except TimeoutError:
                raise QueryFailed(f"no answer from {self.url} within {self._timeout:g}s") from None
            except aiohttp.ClientError as error:
                raise Unreachable(f"request to {self.url} failed: {error}") from None

    async def _decode(self, url: str, reply: aiohttp.ClientResponse) -> Any:
        if reply.status in (401, 403):
            raise Unreachable(f"{url} refused the credentials (HTTP {reply.status}); "
                              "check --prometheus.bearer-token-file or --prometheus.username")
        try:
            body = await reply.json(content_type=None)
        except ValueError:
            raise Unreachable(f"{url} answered HTTP {reply.status} with something other than the "
                              "Prometheus API's JSON: is this the Prometheus base URL?") from None
        if not isinstance(body, dict) or "status" not in body:
            raise Unreachable(f"{url} did not answer like the Prometheus API")
        if body["status"] != "success":
            raise QueryFailed(f"{body.get('errorType', 'error')}: {body.get('error', 'no reason given')}")
        return body["data"]

    async def check(self) -> str:
        """The server's version; raises Unreachable when the report cannot start."""
        data = await self._call("/api/v1/status/buildinfo", {})
        return str(data.get("version", "unknown"))

    async def metric_names(self, start: float, end: float) -> set[str]:
        """Names with samples in [start, end], from the index alone: cheap however long the range."""
        data = await self._call("/api/v1/label/__name__/values", {"start": f"{start:.3f}", "end": f"{end:.3f}"})
        return set(data)

    async def instant(self, query: str, at: float) -> list[Series]:
        data = await self._call("/api/v1/query", {"query": query, "time": f"{at:.3f}"}, post=True)
        if data["resultType"] != "vector":
            raise QueryFailed(f"expected an instant vector from {query!r}, got {data['resultType']}")
        return [Series(item["metric"], [(float(item["value"][0]), float(item["value"][1]))])
                for item in data["result"]]

    async def samples(self, selector: str, at: float) -> list[Series]:
        """Every sample of `selector` (a range vector such as `x[30d]`) at its own timestamp: for sparse series,
        where the times of a few events matter and a range query's steps would skip them."""
        data = await self._call("/api/v1/query", {"query": selector, "time": f"{at:.3f}"}, post=True)
        if data["resultType"] != "matrix":
            raise QueryFailed(f"expected a range vector from {selector!r}, got {data['resultType']}")
        return [Series(item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in data["result"]]

    async def range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        data = await self._call("/api/v1/query_range", {"query": query, "start": f"{start:.3f}",
                                                        "end": f"{end:.3f}", "step": f"{step:g}"}, post=True)
        return [Series(item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in data["result"]]
