"""The simulator's HTTP side: each node's /metrics, file_sd targets, and the fault control API.

All nodes share one listening port; each has its own metrics path
(`/nodes/<name>/metrics`), which the file_sd targets carry as
`__metrics_path__`, with `instance` set to the node's name. The control API
changes faults at run time and answers only loopback clients unless the
operator allows others explicitly.
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import json
import os
import random
import tempfile
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from gpufleet.exporter.render import CONTENT_TYPE
from gpufleet.exporter.server import accepts_gzip
from gpufleet.simulator.faults import KINDS, FaultKind, ScenarioError, parse_fault, seconds
from gpufleet.simulator.fleet import Fleet

FLEET_KEY: web.AppKey[Fleet] = web.AppKey("fleet", Fleet)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("clock", Callable)  # type: ignore[arg-type]
REMOTE_KEY: web.AppKey[bool] = web.AppKey("allow_remote_control", bool)
HOLD_KEY: web.AppKey[float] = web.AppKey("down_hold_seconds", float)
MISSED_KEY: web.AppKey[Callable[[], bool]] = web.AppKey("missed", Callable)  # type: ignore[arg-type]


class SimClock:
    """Simulated seconds since the fleet started, running `speed` times faster than the wall clock."""

    def __init__(self, speed: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.speed = speed
        self._monotonic = monotonic
        self._start = monotonic()

    def __call__(self) -> float:
        return (self._monotonic() - self._start) * self.speed


def file_sd_targets(fleet: Fleet, address: str, labels: dict[str, str]) -> list[dict[str, object]]:
    return [
        {"targets": [address],
         "labels": {**labels, **node.places, "instance": name, "__metrics_path__": f"/nodes/{name}/metrics"}}
        for name, node in fleet.nodes.items()
    ]


def write_file_sd(path: str, targets: list[dict[str, object]]) -> None:
    """Write atomically, so Prometheus never reads a half-written file."""
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as handle:
        json.dump(targets, handle, indent=2)
        handle.write("\n")
    os.replace(handle.name, path)


async def node_metrics(request: web.Request) -> web.StreamResponse:
    fleet = request.app[FLEET_KEY]
    node = fleet.nodes.get(request.match_info["node"])
    if node is None:
        raise web.HTTPNotFound(text="no such node\n")
    now = request.app[CLOCK_KEY]()
    if node.state.restarting_at(now) or request.app[MISSED_KEY]():
        raise web.HTTPServiceUnavailable(text="exporter restarting, or a scrape missed (simulated)\n")
    if node.has_at(FaultKind.EXPORTER_DOWN, now):  # Held until the scraper gives up, as a hung exporter does.
        await asyncio.sleep(request.app[HOLD_KEY])
        raise web.HTTPServiceUnavailable(text="exporter down (simulated)\n")
    # The background loop keeps each node's snapshot fresh; a node not collected yet is collected now.
    body = node.exposition.body() if node.collected else await node.scrape(now, time.monotonic)
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding", "Cache-Control": "no-store"}
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=node.exposition.gzipped(), headers=headers)
    return web.Response(body=body, headers=headers)


def _loopback_only(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not request.app[REMOTE_KEY]:
            try:
                loopback = ipaddress.ip_address(request.remote or "").is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                raise web.HTTPForbidden(text="the control API answers loopback clients only\n")
        return await handler(request)

    return guarded


@_loopback_only
async def list_faults(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    now = request.app[CLOCK_KEY]()
    return web.json_response({"now": now, "faults": [{**f.to_dict(), "active": f.active(now)} for f in fleet.faults]})


@_loopback_only
async def add_faults(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(text="the body must be JSON: one fault or a list of faults\n") from None
    entries = body if isinstance(body, list) else [body]
    now = request.app[CLOCK_KEY]()
    try:
        faults = []
        for index, entry in enumerate(entries):
            if isinstance(entry, dict) and "start" not in entry:
                entry = {**entry, "start": now}  # No start: now.
            elif isinstance(entry, dict) and isinstance(entry["start"], str) and entry["start"].startswith("+"):
                entry = {**entry, "start": now + seconds(entry["start"][1:], f"fault {index + 1}: start")}
            faults.append(parse_fault(entry, f"fault {index + 1}", f"f{next(fleet.ids)}", fleet.nodes,
                                      fleet.gpus_per_node))
    except ScenarioError as err:
        raise web.HTTPBadRequest(text=f"{err}\n") from None
    fleet.add(faults)
    return web.json_response({"added": [f.to_dict() for f in faults]}, status=201)


@_loopback_only
async def remove_faults(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    fault_id = request.match_info.get("id")
    removed = fleet.remove(fault_id)
    if fault_id is not None and not removed:
        raise web.HTTPNotFound(text=f"no fault {fault_id}\n")
    return web.json_response({"removed": [f.to_dict() for f in removed]})


async def landing(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    now = request.app[CLOCK_KEY]()
    jobs = "".join(f"<li>{html.escape(job.scheduler)} {html.escape(job.id)}: {len(job.nodes)} nodes</li>"
                   for job in fleet.jobs_at(now))
    faults = "".join(f"<li>{html.escape(f.id)} {html.escape(f.kind)} on {html.escape(f.node)}"
                     f"{' (active)' if f.active(now) else ''}</li>" for f in fleet.faults)
    kinds = "".join(f"<li><code>{html.escape(kind)}</code>: {html.escape(text)}</li>"
                    for kind, (_, text) in KINDS.items())
    first = next(iter(fleet.nodes))
    page = (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>gpufleet simulator</title></head><body>"
        f"<h1>gpufleet simulator</h1><p>{len(fleet.nodes)} nodes of {fleet.gpus_per_node} GPUs, "
        f"{now:.0f} simulated seconds in. Metrics: <a href=\"nodes/{first}/metrics\">nodes/{first}/metrics</a>.</p>"
        f"<h2>Jobs</h2><ul>{jobs}</ul><h2>Faults</h2><ul>{faults or '<li>none</li>'}</ul>"
        f"<h2>Fault kinds</h2><ul>{kinds}</ul></body></html>"
    )
    return web.Response(text=page, content_type="text/html")


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def missed_scrapes(share: float, seed: int) -> Callable[[], bool]:
    """Whether the next scrape fails: `share` of them, drawn from the seed, as a real fleet misses a scrape
    now and then (a timeout, a reset connection). Prometheus then marks the target's series stale."""
    rng = random.Random(f"missed-scrapes:{seed}")
    return lambda: share > 0 and rng.random() < share


def build_app(fleet: Fleet, clock: Callable[[], float], allow_remote_control: bool = False,
              down_hold_seconds: float = 60.0, missed: Callable[[], bool] = lambda: False) -> web.Application:
    app = web.Application()
    app[MISSED_KEY] = missed
    app[FLEET_KEY] = fleet
    app[CLOCK_KEY] = clock
    app[REMOTE_KEY] = allow_remote_control
    app[HOLD_KEY] = down_hold_seconds
    app.router.add_get("/nodes/{node}/metrics", node_metrics)
    app.router.add_get("/", landing)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/control/faults", list_faults)
    app.router.add_post("/control/faults", add_faults)
    app.router.add_delete("/control/faults", remove_faults)
    app.router.add_delete("/control/faults/{id}", remove_faults)
    return app
