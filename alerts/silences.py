"""`gpufleet maintenance`: put nodes, a leaf switch or a rack into maintenance, and take them out, as silences
in Alertmanager (its v2 API), with a reason, an author and an end.

A silence is the one way to declare maintenance that works whatever the scheduler: it holds back every alert
that carries the target's labels (a node's `instance`, or the `leaf` or `rack` every alert about a node keeps,
and the leaf's or rack's own alert), and nothing else. When it ends, at the stated time or with `end`, what
still fires is sent. Each silence's comment starts with `COMMENT_PREFIX`, which is how `list` and `end` tell
gpufleet's maintenance from other silences.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpufleet import flags
from gpufleet.alerts import config

COMMENT_PREFIX = "gpufleet maintenance: "
TIMEOUT = 10.0  # Seconds for each call to Alertmanager: a person is waiting at a terminal.
DEFAULT_URL = "http://localhost:9093"


class MaintenanceError(Exception):
    """What went wrong, in words for the person at the terminal."""


@dataclass(frozen=True)
class Target:
    """What a maintenance covers: some nodes, one leaf or one rack, in a cluster or any."""

    kind: str  # node, leaf or rack
    names: tuple[str, ...]
    cluster: str = ""

    def matchers(self, c: config.Config) -> list[dict[str, Any]]:
        """Alertmanager matchers. A node's `instance` is its name, with the exporter's port where it has one."""
        if self.kind == "node":
            names = "|".join(re.escape(name) for name in self.names)
            found = [{"name": "instance", "value": f"({names})(:[0-9]+)?", "isRegex": True, "isEqual": True}]
        else:
            label = c.leaf_label if self.kind == "leaf" else c.rack_label
            found = [{"name": label, "value": self.names[0], "isRegex": False, "isEqual": True}]
        if self.cluster:
            found.append({"name": c.cluster_label, "value": self.cluster, "isRegex": False, "isEqual": True})
        return found


class Alertmanager:
    """The few calls of Alertmanager's v2 API that maintenance needs, each bounded by `TIMEOUT`."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}/api/v2/{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace").strip()
            raise MaintenanceError(f"Alertmanager at {self.url} refused {method} {path}: {err.code} {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise MaintenanceError(f"cannot reach Alertmanager at {self.url}: {reason}") from None
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise MaintenanceError(f"{self.url} answered {method} {path} with something other than JSON: "
                                   f"{text[:200]!r}; is it Alertmanager?") from None

    def silences(self) -> list[dict[str, Any]]:
        """gpufleet's maintenance silences that have not ended (active or still to start)."""
        found = self._call("GET", "silences") or []
        return [s for s in found if s.get("comment", "").startswith(COMMENT_PREFIX)
                and s.get("status", {}).get("state") in ("active", "pending")]

    def create(self, matchers: list[dict[str, Any]], starts: datetime.datetime, ends: datetime.datetime,
               author: str, reason: str) -> str:
        body = {"matchers": matchers, "startsAt": _rfc3339(starts), "endsAt": _rfc3339(ends), "createdBy": author,
                "comment": COMMENT_PREFIX + reason}
        answer = self._call("POST", "silences", body)
        return str(answer["silenceID"])

    def expire(self, silence_id: str) -> None:
        self._call("DELETE", f"silence/{silence_id}")


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _same(matchers: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> bool:
    def key(found: list[dict[str, Any]]) -> set[tuple[str, str, bool, bool]]:
        return {(m["name"], m["value"], bool(m["isRegex"]), bool(m.get("isEqual", True))) for m in found}
    return key(matchers) == key(wanted)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "maintenance", help="put nodes, a leaf or a rack into maintenance as Alertmanager silences",
        description="Planned work pages nobody: a maintenance is a silence of every alert of its nodes, leaf or "
                    "rack, with a reason and an end, after which what still fires is sent.")
    commands = parser.add_subparsers(dest="maintenance_command", metavar="COMMAND", required=True)
    start = commands.add_parser("start", help="start a maintenance now")
    _target_flags(start)
    start.add_argument("--reason", required=True, help="why, for the person who reads the silence later")
    ends = start.add_mutually_exclusive_group(required=True)
    ends.add_argument("--for", dest="lasts", type=flags.duration, metavar="DURATION",
                      help="how long it lasts (`4h`, `3d`)")
    ends.add_argument("--until", type=_moment, metavar="TIME",
                      help="when it ends, as ISO 8601 with a time zone (2026-11-28T06:00+01:00)")
    start.add_argument("--author", help="who declares it (default: this user)")
    start.set_defaults(handler=run_start)
    end = commands.add_parser("end", help="end maintenances now: by ID, or by the target they were started for")
    end.add_argument("ids", nargs="*", metavar="ID", help="silence IDs, as `start` and `list` print them")
    _target_flags(end, required=False)
    end.set_defaults(handler=run_end)
    listing = commands.add_parser("list", help="the maintenances that have not ended")
    _common(listing)
    listing.set_defaults(handler=run_list)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alertmanager.url", dest="url", default=DEFAULT_URL, metavar="URL",
                        help="Alertmanager's address (default: %(default)s)")
    config.add_argument(parser)  # The label names of a leaf, a rack and a cluster.


def _target_flags(parser: argparse.ArgumentParser, required: bool = True) -> None:
    _common(parser)
    what = parser.add_mutually_exclusive_group(required=required)
    what.add_argument("--node", action="append", metavar="NODE",
                      help="a node, as its `instance` names it without the port (repeatable)")
    what.add_argument("--leaf", metavar="LEAF", help="every node behind a leaf switch, and the leaf itself")
    what.add_argument("--rack", metavar="RACK", help="every node of a rack, and the rack itself")
    parser.add_argument("--cluster", default="", metavar="NAME",
                        help="only in this cluster (default: wherever the names match)")


def _moment(text: str) -> datetime.datetime:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone: add Z or +01:00")
    return moment


def _target(args: argparse.Namespace) -> Target | None:
    if args.node:
        return Target("node", tuple(args.node), args.cluster)
    if args.leaf or args.rack:
        return Target("leaf" if args.leaf else "rack", (args.leaf or args.rack,), args.cluster)
    return None


def _describe(silence: dict[str, Any]) -> str:
    matchers = ",".join(f'{m["name"]}{"=~" if m["isRegex"] else "="}"{m["value"]}"' for m in silence["matchers"])
    reason = silence["comment"].removeprefix(COMMENT_PREFIX)
    return f'{silence["id"]}  until {silence["endsAt"]}  {{{matchers}}}  by {silence["createdBy"]}: {reason}'


def _user() -> str:
    """This user's login name; empty in a container whose user has no name (no passwd entry, no LOGNAME)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def run_start(args: argparse.Namespace) -> int:
    target = _target(args)
    assert target is not None  # argparse requires one of --node, --leaf, --rack.
    now = datetime.datetime.now(datetime.UTC)
    ends = args.until or now + datetime.timedelta(seconds=args.lasts)
    if ends <= now:
        return _fail(f"--until {args.until.isoformat()} has passed")
    if not args.reason.strip():
        return _fail("--reason must say why")
    author = args.author or _user()
    if not author:
        return _fail("--author must name who declares it: this user has no name to take")
    try:
        silence_id = Alertmanager(args.url).create(target.matchers(args.config), now, ends, author,
                                                   args.reason.strip())
    except MaintenanceError as err:
        return _fail(str(err))
    print(f"{silence_id}  maintenance of {target.kind} {', '.join(target.names)} until {_rfc3339(ends)}")
    return 0


def run_end(args: argparse.Namespace) -> int:
    target = _target(args)
    if bool(args.ids) == (target is not None):
        return _fail("give either silence IDs or one of --node, --leaf, --rack")
    manager = Alertmanager(args.url)
    try:
        ids = args.ids
        if target is not None:
            wanted = target.matchers(args.config)
            ids = [s["id"] for s in manager.silences() if _same(s["matchers"], wanted)]
            if not ids:
                return _fail(f"no maintenance of {target.kind} {', '.join(target.names)} is in force "
                             "(`gpufleet maintenance list` shows those that are)")
        for silence_id in ids:
            manager.expire(silence_id)
            print(f"{silence_id}  ended")
    except MaintenanceError as err:
        return _fail(str(err))
    return 0


def run_list(args: argparse.Namespace) -> int:
    try:
        silences = Alertmanager(args.url).silences()
    except MaintenanceError as err:
        return _fail(str(err))
    for silence in sorted(silences, key=lambda s: s["endsAt"]):
        print(_describe(silence))
    return 0


def _fail(message: str) -> int:
    print(f"gpufleet maintenance: error: {message}", file=sys.stderr)
    return 1
