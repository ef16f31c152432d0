"""The receiving end of alerts, for the tests and benchmarks that run the real Prometheus and Alertmanager.

`Receiver` plays the pager (PagerDuty's Events API v2) and the ticket bridge (a webhook) on 127.0.0.1;
`routing` points the production Alertmanager configuration at it; `AlertLog` polls Prometheus (or
vmalert, whose alerts API answers alike) for every alert, pending or firing, and keeps when each fired,
with its annotations as they first fired.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from gpufleet import duration
from gpufleet.alerts.pipeline import WATCHDOG
from gpufleet.devtools.net import free_port, http
from gpufleet.devtools.paths import ROUTING
from gpufleet.devtools.waiting import HarnessError

Labels = frozenset[tuple[str, str]]  # An alert's labels, as a key.


@dataclass(frozen=True)
class Page:
    """One PagerDuty event: its dedup key (Alertmanager's group, and so PagerDuty's incident), what it did
    (trigger or resolve), when (monotonic seconds), and the firing alerts' labels it listed."""

    key: str
    action: str
    at: float
    alerts: tuple[dict[str, str], ...]


class Receiver:
    """The pager (PagerDuty's Events API v2), ticket and heartbeat (webhook) endpoints, on 127.0.0.1. The heartbeat
    (the Watchdog, each minute) is kept apart, as when each heartbeat arrived: it is no alert a fault explains."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str]]] = []
        self._arrived: list[float] = []  # When each of `received` came (monotonic seconds).
        self.pages: list[Page] = []
        self.heartbeats: list[float] = []  # Monotonic seconds.
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.add(self.path.strip("/"), body)
                self.send_response(202 if self.path == "/pager" else 200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, path: str, body: dict[str, Any]) -> None:
        if path == "heartbeat":
            with self._lock:
                self.heartbeats.append(time.monotonic())
            return
        if path == "pager":
            action = str(body.get("event_action"))
            firing = body.get("payload", {}).get("custom_details", {}).get("firing", "")
            alerts = [dict(re.findall(r"^ - (\w+) = (.*)$", block.split("Annotations:")[0], re.M))
                      for block in firing.split("Labels:")[1:]] if action == "trigger" else []
            with self._lock:
                self.pages.append(Page(str(body.get("dedup_key")), action, time.monotonic(), tuple(alerts)))
        else:
            alerts = [a["labels"] for a in body["alerts"] if a["status"] == "firing"]
        with self._lock:
            self.received.extend((path, labels) for labels in alerts)
            self._arrived.extend(time.monotonic() for _ in alerts)

    def incidents(self) -> list[tuple[str, list[Page]]]:
        """The pager's incidents: each dedup key's triggers from one opening to its resolve (PagerDuty opens a
        new incident for a key triggered again after it resolved), with every page it received."""
        opened: dict[str, list[Page]] = {}
        incidents: list[tuple[str, list[Page]]] = []
        with self._lock:
            pages = list(self.pages)
        for page in pages:
            if page.action == "trigger":
                if page.key not in opened:
                    opened[page.key] = []
                    incidents.append((page.key, opened[page.key]))
                opened[page.key].append(page)
            elif page.action == "resolve" and page.key in opened:
                opened.pop(page.key).append(page)
        return incidents

    def snapshot(self) -> list[tuple[str, dict[str, str]]]:
        with self._lock:
            return list(self.received)

    def arrivals(self) -> list[tuple[float, str, dict[str, str]]]:
        """What `snapshot` holds, each with when it came (monotonic seconds)."""
        with self._lock:
            return [(at, path, labels) for at, (path, labels) in zip(self._arrived, self.received, strict=True)]

    def first(self, path: str, alertname: str, instance: str) -> float | None:
        """When `path` first received `alertname` firing on `instance` (monotonic seconds), if it has."""
        with self._lock:
            return next((at for at, (to, labels) in zip(self._arrived, self.received, strict=True)
                         if to == path and labels.get("alertname") == alertname and labels.get("instance") == instance),
                        None)


class AlertLog:
    """Every alert Prometheus or vmalert reports, pending or firing, with when it first was seen, polled each
    second; but the Watchdog, which fires always (its heartbeats reach `Receiver.heartbeats`).

    `episodes` keeps each alert's spells of firing as [first, last] seen (monotonic seconds): an alert
    missing from more than `gap` seconds of polls had resolved, and a later firing is a new episode. Missing
    is counted from the first poll that answered without it: on a busy machine a poll can come seconds late,
    and time nobody asked is no evidence of a break. Polls are blind while the engine does not answer (the
    drills restart it on the same port) and for `gap` seconds after it answers again, as a restarted engine
    lists its alerts only from each group's first evaluation: that time is not counted as missing. Whether a
    restart resolved anything is Alertmanager's to say.
    """

    def __init__(self, url: str, gap: float = 3.0) -> None:
        self.url = url
        self.gap = gap
        self.seen: dict[Labels, tuple[float, str]] = {}
        self.fired: dict[Labels, float] = {}  # When each alert was first seen firing.
        self.episodes: dict[Labels, list[list[float]]] = {}
        self.told: dict[Labels, list[dict[str, str]]] = {}  # As each of its `episodes` began, in their order.
        self._blind: list[list[float]] = []  # [from, to] of each spell of blind polls; to is inf while down.
        self._missing: dict[Labels, float] = {}  # Firing alerts by the first poll since that answered without them.
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _blind_within(self, start: float, end: float) -> float:
        """Seconds of [start, end] the polls were blind."""
        return sum(max(0.0, min(end, to) - max(start, since)) for since, to in self._blind)

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            try:
                status, body = http("GET", f"{self.url}/api/v1/alerts")
            except OSError:
                status, body = 0, b""
            now = time.monotonic()
            if status != 200:
                if not self._blind or self._blind[-1][1] < now:
                    self._blind.append([now, math.inf])
                continue
            if self._blind and self._blind[-1][1] == math.inf:
                self._blind[-1][1] = now + self.gap
            firing = set()
            for alert in json.loads(body)["data"]["alerts"] or []:  # vmalert answers null for none.
                if alert["labels"].get("alertname") == WATCHDOG:  # Always firing, by design.
                    continue
                key = frozenset(alert["labels"].items())
                first, state = self.seen.get(key, (now, alert["state"]))
                self.seen[key] = (first, "firing" if "firing" in (state, alert["state"]) else state)
                if alert["state"] == "firing":
                    firing.add(key)
                    self.fired.setdefault(key, now)
                    spells = self.episodes.setdefault(key, [])
                    since = self._missing.pop(key, now)
                    if spells and now - since - self._blind_within(since, now) <= self.gap:
                        spells[-1][1] = now
                    else:
                        spells.append([now, now])
                        self.told.setdefault(key, []).append(alert.get("annotations", {}))
            for key in self.episodes.keys() - firing:
                self._missing.setdefault(key, now)

    @property
    def annotations(self) -> dict[Labels, dict[str, str]]:
        """Each alert's annotations as its latest episode began."""
        return {key: told[-1] for key, told in self.told.items()}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def alertmanager_alerts(am_url: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager holds unresolved (silenced and inhibited ones too), as its v2 API lists them."""
    status, body = http("GET", f"{am_url}/api/v2/alerts")
    if status != 200:
        raise HarnessError(f"{am_url} listed no alerts: {status} {body[:500]!r}")
    alerts: list[dict[str, Any]] = json.loads(body)
    return alerts


def post_alerts(am_url: str, alerts: list[dict[str, str]]) -> None:
    """Send firing alerts (each given by its labels) to Alertmanager, as an engine does at each evaluation."""
    body = [{"labels": labels} for labels in alerts]
    status, answer = http("POST", f"{am_url}/api/v2/alerts", body)
    if status != 200:
        raise HarnessError(f"{am_url} refused the alerts: {status} {answer[:500]!r}")


def routing(workdir: Path, receiver: Receiver, time_scale: float = 1.0) -> Path:
    """The production routing, with the pager key written to a file here and receivers pointed here, and its
    timers (group_wait, group_interval, repeat_interval) divided by `time_scale`, as the rules' are."""
    config = yaml.safe_load(ROUTING.read_text())
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        routes += route.get("routes", [])
        for timer in ("group_wait", "group_interval", "repeat_interval"):
            if timer in route:
                route[timer] = f"{max(1, round(duration.parse(route[timer]) * 1000 / time_scale))}ms"
    key = workdir / "pagerduty-routing-key"
    key.write_text("e2e-test-key\n")
    for entry in config["receivers"]:
        for pager in entry.get("pagerduty_configs", []):
            pager.update(routing_key_file=str(key), url=f"{receiver.url}/pager")
        for hook in entry.get("webhook_configs", []):
            hook["url"] = f"{receiver.url}/ticket"
        if entry["name"] == "heartbeat":  # The routing names no service until a site adds its own.
            entry["webhook_configs"] = [{"url": f"{receiver.url}/heartbeat", "send_resolved": False}]
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path
