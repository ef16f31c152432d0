"""The remediator's HTTP side: Alertmanager's webhook, the breaker's off switch, and its own /metrics.

The acting endpoints take a bearer token (read from a file at each request, so it rotates without a restart)
where one is set; TLS, client certificates and basic auth come from the same web-config file as the
exporter's. Every refusal is a log line, an HTTP status and a count in `gpufleet_remediate_webhooks_total`.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufleet.exporter.server import secure
from gpufleet.exporter.webconfig import WebConfigWatcher
from gpufleet.remediate.engine import Remediator
from gpufleet.remediate.slurm import Node
from gpufleet.remediate.webhook import Refused, parse

log = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024  # Alertmanager's largest groups are far smaller; a bigger body is no webhook.
_STATUS = {"malformed": 400, "unauthorized": 401, "unknown_alert": 422, "unknown_node": 422}


class Webhooks:
    """Checks and records each webhook; `counts` by result."""

    def __init__(self, remediator: Remediator, node_label: str, node_pattern: re.Pattern[str],
                 token_file: Path | None) -> None:
        self.remediator, self.node_label, self.node_pattern = remediator, node_label, node_pattern
        self.token_file = token_file
        self.counts: Counter[str] = Counter()

    def authorised(self, request: web.Request) -> bool:
        if self.token_file is None:
            return True
        try:
            token = self.token_file.read_text().strip()
        except OSError as err:
            log.error("token file %s unreadable (%s): every request refused", self.token_file, err)
            return False
        given = request.headers.get("Authorization", "")
        return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def refuse(self, kind: str, message: str) -> web.Response:
        self.counts[kind] += 1
        log.warning("webhook refused (%s): %s", kind, message)
        return web.json_response({"status": "refused", "reason": kind, "message": message},
                                 status=_STATUS[kind])

    async def receive(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return self.refuse("unauthorized", f"no valid bearer token from {request.remote}")
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as err:
            return self.refuse("malformed", f"body is not JSON: {err}")
        try:
            alerts = parse(body, self.node_label, self.node_pattern)
        except Refused as err:
            return self.refuse(err.kind, str(err))
        known = self.remediator.known
        unknown = sorted({a.node for a in alerts if known and a.node not in known})
        if unknown:
            return self.refuse("unknown_node", f"Slurm has no node {', '.join(unknown)}")
        self.remediator.receive(alerts)
        self.counts["accepted"] += 1
        return web.json_response({"status": "accepted", "alerts": len(alerts)})

    async def close_breaker(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return self.refuse("unauthorized", f"no valid bearer token from {request.remote}")
        self.remediator.close_breaker(f"POST /-/breaker/close from {request.remote}")
        return web.json_response({"status": "closed"})


class RemediatorCollector(Collector):
    """The remediator's own series, read from its state at each scrape."""

    def __init__(self, remediator: Remediator, webhooks: Webhooks) -> None:
        self.remediator, self.webhooks = remediator, webhooks

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        r, state = self.remediator, self.remediator.state
        p = "gpufleet_remediate_"
        actions = CounterMetricFamily(p + "actions", "Remediation decisions, by action and result (dry_run: "
                                      "what it would have done).", labels=["action", "result"])
        for (action, result), count in sorted(r.actions.items()):
            actions.add_metric([action, result], count)
        yield actions
        hooks = CounterMetricFamily(p + "webhooks", "Webhook requests, by result.", labels=["result"])
        for result in ("accepted", *_STATUS):
            hooks.add_metric([result], self.webhooks.counts[result])
        yield hooks
        phases = GaugeMetricFamily(p + "nodes", "Nodes gpufleet holds, by phase: wanted (drain not done yet), "
                                   "drained, failed (check failed), operator (drained by someone else).",
                                   labels=["phase"])
        for phase in ("wanted", "drained", "failed", "operator"):
            phases.add_metric([phase], sum(record.phase == phase for record in state.nodes.values()))
        yield phases
        yield GaugeMetricFamily(p + "drained_nodes", "Nodes drained by gpufleet now (in dry run: would be).",
                                value=sum(record.phase in ("drained", "failed") for record in state.nodes.values()))
        yield GaugeMetricFamily(p + "drains_last_hour", "Drains by gpufleet in the breaker's sliding hour.",
                                value=len(state.recent_drains(r.clock())))
        yield GaugeMetricFamily(p + "breaker_open", "1 while the breaker stops every drain, until an operator "
                                "closes it.", value=int(state.breaker.open))
        yield GaugeMetricFamily(p + "dry_run", "1 when decisions are logged and counted, not carried out.",
                                value=int(r.settings.dry_run))
        yield GaugeMetricFamily(p + "slurm_up", "Whether the last call to the Slurm controller succeeded.",
                                value=int(r.slurm_up))
        yield CounterMetricFamily(p + "slurm_errors", "Slurm calls that failed (each is tried again).",
                                  value=r.slurm_errors)
        yield GaugeMetricFamily(p + "slurm_nodes", "Nodes in Slurm's last node list: a webhook for another is "
                                "refused.", value=len(r.known))
        yield from _slurm_nodes(r.known.values())
        ends = GaugeMetricFamily("gpufleet_slurm_node_maintenance_end_timestamp_seconds", "The stated end of the "
                                 "last maintenance reservation that held the node, while it holds it or Slurm keeps "
                                 "the node out of service after it.", labels=["node"])
        for name, end in sorted(state.maintenance_ends.items()):
            ends.add_metric([name], end)
        yield ends
        failed = GaugeMetricFamily(p + "check_failed", "1 for each node whose check failed after its repair: it "
                                   "stays drained.", labels=["node"])
        for name, record in sorted(state.nodes.items()):
            if record.phase == "failed":
                failed.add_metric([name], 1)
        yield failed


def _slurm_nodes(nodes: Iterable[Node]) -> Iterator[GaugeMetricFamily]:
    """Slurm's view of each node, as last listed: the rules join it to the node's exporter (by the node's name in
    its `instance`) to keep planned work off the pager and to see a node Slurm lost while its exporter answers."""
    state = GaugeMetricFamily("gpufleet_slurm_node_state", "1 for each of the node's Slurm states and flags (idle, "
                              "allocated, mixed, down, drain, maintenance, reboot_requested, ...); not_responding "
                              "while its slurmd does not answer the controller.", labels=["node", "state"])
    reason = GaugeMetricFamily("gpufleet_slurm_node_reason_info", "The reason Slurm holds for a drained or down "
                               "node, as its last drain or down set it.", labels=["node", "reason"])
    for node in sorted(nodes, key=lambda n: n.name):
        for word in sorted(node.states | ({"NOT_RESPONDING"} if not node.responding else set())):
            state.add_metric([node.name, word.lower()], 1)
        if node.reason:
            reason.add_metric([node.name, node.reason], 1)
    yield state
    yield reason


def build_app(webhooks: Webhooks, web_config: WebConfigWatcher | None = None) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RemediatorCollector(webhooks.remediator, webhooks))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain",
                            charset="utf-8", headers={"Cache-Control": "no-store"})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(middlewares=[secure(web_config)] if web_config else [], client_max_size=MAX_BODY)
    app.router.add_post("/webhook", webhooks.receive)
    app.router.add_post("/-/breaker/close", webhooks.close_breaker)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
