"""The Alertmanager routing as a Prometheus Operator AlertmanagerConfig: the very routing compose's Alertmanager
runs (compose/alertmanager/alertmanager.yml, packaged beside this module), translated field by field, so that a
change to it reaches Kubernetes with the next build.

Secrets stay out of the object: the pager's PagerDuty key is read from a Secret the site creates.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpufleet.deploy.site import Site

ROUTING = Path(__file__).parent / "alertmanager.yml"
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
# Alertmanager's route fields and the AlertmanagerConfig's names for them.
_ROUTE_FIELDS = {"receiver": "receiver", "group_by": "groupBy", "group_wait": "groupWait",
                 "group_interval": "groupInterval", "repeat_interval": "repeatInterval", "continue": "continue"}


class RoutingError(ValueError):
    """Something in the routing the translation does not know; the message says what."""


def matcher(text: str) -> dict[str, str]:
    """`severity="critical"` as {name, value, matchType}."""
    match = _MATCHER.fullmatch(text)
    if match is None:
        raise RoutingError(f"matcher {text!r} is not name, operator and quoted value")
    name, operator, value = match.groups()
    return {"name": name, "value": value.replace('\\"', '"').replace("\\\\", "\\"), "matchType": operator}


def _route(route: dict[str, Any]) -> dict[str, Any]:
    unknown = set(route) - set(_ROUTE_FIELDS) - {"matchers", "routes"}
    if unknown:
        raise RoutingError(f"route fields {sorted(unknown)} have no translation")
    result = {_ROUTE_FIELDS[key]: value for key, value in route.items() if key in _ROUTE_FIELDS}
    if "matchers" in route:
        result["matchers"] = [matcher(text) for text in route["matchers"]]
    if "routes" in route:
        result["routes"] = [_route(child) for child in route["routes"]]
    return result


def _receiver(receiver: dict[str, Any], site: Site) -> dict[str, Any]:
    result: dict[str, Any] = {"name": receiver["name"]}
    for key, configs in receiver.items():
        if key == "pagerduty_configs":
            result["pagerdutyConfigs"] = [{"routingKey": {"name": site.pagerduty_secret, "key": "routing-key"},
                                           "sendResolved": bool(c.get("send_resolved", True))} for c in configs]
        elif key == "webhook_configs":
            url = {"ticket": site.ticket_url, "heartbeat": site.heartbeat_url}.get(receiver["name"])
            if url is None:
                raise RoutingError(f"receiver {receiver['name']}: no site value gives its webhook's URL")
            result["webhookConfigs"] = [{"url": url, "sendResolved": bool(c.get("send_resolved", True))}
                                        for c in configs]
        elif key != "name":
            raise RoutingError(f"receiver {receiver['name']}: {key} has no translation")
    if receiver["name"] == "heartbeat" and site.heartbeat_url:  # The site's heartbeat service, where it has one.
        result["webhookConfigs"] = [{"url": site.heartbeat_url, "sendResolved": False}]
    return result


def spec(site: Site, alerts: list[str], routing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The AlertmanagerConfig's spec for `routing` (compose's, by default), its top route narrowed to gpufleet's
    `alerts` by name: with the Operator's namespace matcher off (docs/deployment/kubernetes.md), the route would
    otherwise take every alert of the cluster to gpufleet's pager and ticket queue."""
    routing = routing if routing is not None else yaml.safe_load(ROUTING.read_text(encoding="utf-8"))
    top = _route(routing["route"])
    top["matchers"] = [{"name": "alertname", "value": "|".join(sorted(alerts)), "matchType": "=~"},
                       *top.get("matchers", [])]
    return {
        "route": top,
        "inhibitRules": [{"sourceMatch": [matcher(m) for m in rule["source_matchers"]],
                          "targetMatch": [matcher(m) for m in rule["target_matchers"]],
                          "equal": rule.get("equal", [])} for rule in routing.get("inhibit_rules", [])],
        "receivers": [_receiver(receiver, site) for receiver in routing["receivers"]],
    }
