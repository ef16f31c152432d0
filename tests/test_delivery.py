"""The end-to-end tests' alert log, against an engine's API that answers, stops answering and comes back."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet.devtools.delivery import AlertLog

ALERT = {"labels": {"alertname": "GpuNeedsReboot", "instance": "n1"}, "state": "firing", "annotations": {}}


class Engine(BaseHTTPRequestHandler):
    """/api/v1/alerts as the test's `mode` says: the alert firing, no alert, or not serving (503)."""

    mode = "firing"
    description = ""

    def do_GET(self) -> None:
        if Engine.mode == "down":
            self.send_response(503)
            self.end_headers()
            return
        if Engine.mode == "slow":
            time.sleep(3.5)  # An engine, or a poller, on a machine too busy to answer in time.
        alert = {**ALERT, "annotations": {"description": Engine.description}}
        alerts = [alert] if Engine.mode in ("firing", "slow") else None  # vmalert answers null for none.
        body = json.dumps({"status": "success", "data": {"alerts": alerts}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _log(modes: tuple[tuple[str, float], ...], descriptions: tuple[str, ...] = ()) -> AlertLog:
    """An AlertLog with a 2 s gap, after an engine went through `modes` (mode, seconds), its alert described by
    each of `descriptions` in turn (one per mode; none: no description)."""
    Engine.mode, Engine.description = modes[0][0], ""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = AlertLog(f"http://127.0.0.1:{server.server_address[1]}", gap=2.0)
    try:
        for number, (mode, seconds) in enumerate(modes):
            Engine.mode = mode
            Engine.description = descriptions[number] if descriptions else ""
            time.sleep(seconds)
    finally:
        log.stop()
        server.shutdown()
    return log


def _spells(modes: tuple[tuple[str, float], ...]) -> list[list[float]]:
    """The firing alert's episodes, as an AlertLog with a 2 s gap saw an engine go through `modes` (mode, seconds)."""
    [spells] = _log(modes).episodes.values()
    return spells


def test_a_restart_of_the_engine_is_no_break_but_an_alert_missing_while_it_answers_is():
    """A restarted engine lists its alerts again only from its first evaluation: the seconds it did not answer,
    and a gap after it answers, are not counted as the alert missing (whether the restart resolved it is
    Alertmanager's to say). Missing for longer than the gap while the engine answers is a new episode."""
    spells = _spells((("firing", 2.5), ("down", 2.0), ("empty", 1.5), ("firing", 2.5), ("empty", 4.5),
                      ("firing", 2.5)))
    assert len(spells) == 2, spells


def test_a_poll_that_comes_late_is_no_break():
    """Seconds between two polls that both list the alert are not seconds it was missing, however many: only a
    poll answered without it says it resolved."""
    spells = _spells((("firing", 2.5), ("slow", 4.0), ("firing", 2.5)))
    assert len(spells) == 1, spells


def test_each_episode_keeps_what_the_alert_said_as_it_began():
    """An alert that fires again later, for another reason (a node that straggles in a later round, for another
    cause), keeps each episode's own description; the latest is also the alert's."""
    log = _log((("firing", 2.5), ("empty", 4.5), ("firing", 2.5)), ("thermal slowdown", "", "power brake"))
    [told] = log.told.values()
    [spells] = log.episodes.values()
    assert [note["description"] for note in told] == ["thermal slowdown", "power brake"], (told, spells)
    assert [note["description"] for note in log.annotations.values()] == ["power brake"]
