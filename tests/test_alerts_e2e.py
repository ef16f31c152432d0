"""End to end in real programs: simulated faults, through Prometheus or VictoriaMetrics and the generated rules,
to Alertmanager.

The simulator serves a 16-node fleet. A real Prometheus scrapes it through file_sd and evaluates the
rules generated at time scale 8 (every window and `for` divided by 8, thresholds unchanged); beside it,
three vmagents scrape a third of the same targets each into one VictoriaMetrics, and vmalert evaluates
the same rules (its copy of the file, with each group's concurrency) over the whole fleet there, so that
a job's nodes are compared across shards.
Each engine notifies its own real Alertmanager, with the production routing and only its receiver
addresses pointed here, which delivers to a webhook receiver run by this test. After a healthy first
minute, one fault of every kind the simulator knows is injected, each on its own node, GPU or port.
Once every alert is delivered, vmalert is restarted, and then a vmagent shard is stopped: drills of what
an on-call engineer must not notice, and must.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from scenario import (
    EXPECTED,
    FAULTS_AT,
    REBOOT_SECONDS,
    REPAIR_AT,
    REPAIRED,
    RESTART_AT,
    SCENARIO,
    UNREPAIRED,
    UNSCRAPED,
    Expected,
)

from gpufleet import duration
from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools.delivery import AlertLog, Receiver, alertmanager_alerts, routing
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import (
    alertmanager,
    prometheus,
    prometheus_config,
    scrape_timing,
    simulator,
    victoria_metrics,
    vmagent,
    vmalert,
)
from gpufleet.devtools.prom import query, scraped_instances
from gpufleet.devtools.waiting import wait_for
from gpufleet.simulator.faults import KINDS

from layouts import SIXTEEN_NODES, SIXTEEN_NODES_TOPOLOGY, node, write

TIME_SCALE = 8
SHARDS = 3  # vmagents, each scraping its share of the fleet into the one VictoriaMetrics vmalert reads.
ATTEMPTS = 5  # Starts of the sharded fleet until the large job spans every shard (one in eight misses one).
LOOKBACK = f"{round(300 / TIME_SCALE)}s"  # vmalert's 5 minutes for a series that stopped, scaled like the windows.
# How soon before an alert went pending a failed scrape explains it: a scrape, an evaluation and the alert log's poll.
DARK_LOOKBACK = 10.0
pytestmark = [pytest.mark.slow, pytest.mark.e2e]




def test_the_scenario_covers_every_fault_kind():
    """Each kind but a node down, whose page tells it from an exporter down by blackbox_exporter's probes: without
    them it is NodeExporterDown as `exporter_down` is, and tests/test_probes.py runs it with them."""
    assert {fault["kind"] for fault, _ in SCENARIO} == set(KINDS) - {"node_down"}


@dataclass
class Engine:
    """One rule engine watching the fleet: what it reported (pending and firing), what its Alertmanager
    delivered, and the store its rules read."""

    name: str
    log: AlertLog
    receiver: Receiver
    store: str

    def delivered_all(self) -> bool:
        got = self.receiver.snapshot()
        return all(any(path == e.receiver and e.matches(labels) for path, labels in got)
                   for e in EXPECTED if e.receiver and e.required)


def test_each_fault_fires_its_alert_at_its_receiver_and_a_healthy_fleet_fires_nothing(tmp_path):
    """Prometheus, and three vmagent shards with VictoriaMetrics and vmalert, watch one simulated fleet at
    once, each engine with its own Alertmanager (the same routing) and receiver: the same rules must
    fire the same alerts in both and reach the same receivers (vmalert's copy has the pager's groups ask up
    to four rules at once). Then vmalert is restarted, and none of its alerts may resolve or start again;
    and a shard is stopped, which must page with NodesUnscraped."""
    scenario = tmp_path / "scenario.yml"
    scenario.write_text(yaml.safe_dump({"faults": [{"start": f"{FAULTS_AT}s", **fault} for fault, _ in SCENARIO]}))
    rules, vmalert_rules = tmp_path / "rules.yml", tmp_path / "vmalert-rules.yml"
    rules.write_text(render(Config().scaled(TIME_SCALE)))
    vmalert_rules.write_text(render(Config().scaled(TIME_SCALE), "vmalert"))  # With each group's concurrency.
    receivers = {name: Receiver() for name in ("prometheus", "vmalert")}
    layout = write(tmp_path / "layout.yml", SIXTEEN_NODES)
    places = write(tmp_path / "topology.yml", SIXTEEN_NODES_TOPOLOGY)
    with contextlib.ExitStack() as stack:
        targets, storage, shards, scraped, started = _sharded_fleet(
            stack, tmp_path / "vmalert", "--nodes=16", "--seed=0", f"--layout={layout}", f"--topology={places}",
            "--cluster=e2e", "--collect-interval=1s", f"--scenario={scenario}")
        prom_am, vm_am = (stack.enter_context(_alertmanager(tmp_path / name, receiver)).url
                          for name, receiver in receivers.items())
        config = prometheus_config(tmp_path / "prometheus.yml", targets, "1s", rules, prom_am)
        prom_url = stack.enter_context(prometheus(config, tmp_path / "data")).url
        evaluating = stack.enter_context(contextlib.ExitStack())  # vmalert alone, for the restart drill.
        vmalert_url = evaluating.enter_context(_vmalert(vmalert_rules, storage, vm_am)).url
        for store in (prom_url, storage):
            wait_until_scraped(store, len(SIXTEEN_NODES_TOPOLOGY["nodes"]), started)
        def restart_vmalert() -> None:
            evaluating.close()
            evaluating.enter_context(_vmalert(vmalert_rules, storage, vm_am, port=int(vmalert_url.rsplit(":", 1)[1])))
        engines = [Engine("prometheus", AlertLog(prom_url), receivers["prometheus"], prom_url),
                   Engine("vmalert", AlertLog(vmalert_url), receivers["vmalert"], storage)]
        try:
            _wait_for_deliveries_and_repairs(engines, started)
            kept, lost = _restart_drill(restart_vmalert, vm_am, prom_am)
            # A shard lost, with no replica: its nodes vanish from the store, and one page says what share.
            dark = _shard_to_lose(scraped)
            shards[dark].close()
            lost_at = time.monotonic()
            # Its nodes' `up` leaves vmalert's queries after the lookback (37.5 s), the alert's `for` is as long,
            # and Alertmanager's group_wait is 4 s at this scale: about 80 s, with room for a busy machine.
            wait_for(lambda: any(UNSCRAPED.matches(labels) and path == "pager"
                                 for path, labels in receivers["vmalert"].snapshot()), 150, "NodesUnscraped")
            print(f"shard {dark} ({len(scraped[dark])} nodes) lost: paged after {time.monotonic() - lost_at:.1f}s")
            failed = {engine.name: _failed_scrapes(engine.store, started) for engine in engines}
        finally:
            for engine in engines:
                engine.log.stop()
    # Fewer than the faults fired: the repaired GPUs, the leaf switch and the events shown for a window are over.
    assert len(kept) >= 15 and lost == {}, f"alerts that vmalert's restart resolved or restarted: {lost}"
    for engine in engines:
        print(f"{engine.name}:")
        check_heartbeat(engine.receiver)
        _check(engine, started, [UNSCRAPED] if engine.name == "vmalert" else [], failed[engine.name])
        _check_held_until_repaired(engine, started)
        _check_one_incident_per_fault(engine, started)
    # And with the same labels: each required alert fired as the same series in both engines.
    for e in EXPECTED:
        if e.required:
            fired = [{key for key in engine.log.fired if e.matches(dict(key))} for engine in engines]
            assert fired[0] == fired[1], (e, fired)


def _shard_to_lose(scraped: list[set[str]]) -> int:
    """The shard of a node with a page held for a repair never done, where it has another node as well (the page
    must not resolve while its node is unscraped); else the smallest with two nodes."""
    held = {e.instance for e in UNREPAIRED}
    return min((number for number in range(SHARDS) if len(scraped[number]) >= 2),
               key=lambda n: (not scraped[n] & held, len(scraped[n])))


def _wait_for_deliveries_and_repairs(engines: list[Engine], started: float) -> None:
    """Until every required alert has reached its receiver at both engines, and the repairs are done and the
    rebooted node's incident resolved (at the next group_interval, 37.5 s at this scale), before the drills."""
    deadline = time.monotonic() + FAULTS_AT + 240
    while not all(engine.delivered_all() for engine in engines) and time.monotonic() < deadline:
        time.sleep(1)
    repaired = started + REPAIR_AT + REBOOT_SECONDS + duration.parse(LOOKBACK) + 10
    wait_for(lambda: time.monotonic() > repaired and all(_resolved(engine, node(15)) for engine in engines), 150,
             "the repaired node's resolve")


def _resolved(engine: Engine, instance: str) -> bool:
    """Whether the pager incident of `instance` has been opened and resolved."""
    return any(pages[-1].action == "resolve" and any(a.get("instance") == instance for p in pages for a in p.alerts)
               for _, pages in engine.receiver.incidents())


def check_heartbeat(receiver: Receiver) -> None:
    """The Watchdog reached the heartbeat receiver all along: about once a production minute (7.5 s here), and
    with no gap a heartbeat service would page for (four minutes)."""
    beats = list(receiver.heartbeats)
    gaps = sorted(later - earlier for earlier, later in itertools.pairwise(beats))
    print(f"heartbeats: {len(beats)}, gaps {gaps[len(gaps) // 2] if gaps else 0:.1f}s at the median, "
          f"{max(gaps, default=0):.1f}s at most")
    assert len(beats) >= 10 and gaps[len(gaps) // 2] <= 9.5 and gaps[-1] <= 30, (len(beats), gaps)


def _check_held_until_repaired(engine: Engine, started: float) -> None:
    """Each repaired GPU's alert fired once, without a break through node 1's exporter restart, node 16's hung
    driver or the repaired node's reboot, and ended once its repair was done; node 1's GPU 0, never rebooted, and
    node 16's GPU 5, which its reboot did not bring back, still need theirs."""
    for expected, repaired, vanishes in REPAIRED:
        spells = [spell for key, spells in engine.log.episodes.items() if expected.matches(dict(key))
                  for spell in spells]
        assert len(spells) == 1, f"{engine.name}: {expected.alertname} on {expected.instance} fired as {spells}"
        [(first, last)] = spells
        print(f"{engine.name}: {expected.alertname} {expected.instance} held {first - started:.1f}s to "
              f"{last - started:.1f}s, repaired at {repaired}s")
        assert first - started < RESTART_AT and last - started >= repaired - 1, (expected, first, last)
        # Seen done within a collection, a scrape and two evaluations of the repair's end, and the AlertLog's poll.
        lag = 5 + (duration.parse(LOOKBACK) if vanishes and engine.name == "vmalert" else 0)
        assert last - started <= repaired + lag, (expected, last - started)
    for unrepaired in UNREPAIRED:  # Through the exporter restart, node 16's reboot and the lost shard's drill.
        still = [spells for key, spells in engine.log.episodes.items() if unrepaired.matches(dict(key))]
        assert len(still) == 1 and len(still[0]) == 1, (unrepaired, still)
        assert still[0][0][1] > started + REPAIR_AT + REBOOT_SECONDS + 40, (unrepaired, still)


def _check_one_incident_per_fault(engine: Engine, started: float) -> None:
    """Every fault opens at most one pager incident (a PagerDuty dedup key, from opening to resolve): a node's
    faults share their node's, and the repaired node's incident resolves after its reboot, not before."""
    incidents = engine.receiver.incidents()
    for line in incidents:
        key, pages = line
        print(f"{engine.name}: incident {key[:12]} {[p.action for p in pages]} "
              f"{sorted({(a['alertname'], a.get('instance', '')) for p in pages for a in p.alerts})}")
    for fault, alerts in SCENARIO:
        opened = {index for index, (_, pages) in enumerate(incidents)
                  if any(e.receiver == "pager" and e.matches(a) for e in alerts for p in pages for a in p.alerts)}
        assert len(opened) <= 1, f"{engine.name}: {fault} opened {len(opened)} incidents"
    rebooted = [pages for _, pages in incidents if any(a.get("instance") == node(15) for p in pages for a in p.alerts)]
    assert len(rebooted) == 1 and rebooted[0][-1].action == "resolve", rebooted
    assert rebooted[0][-1].at - started >= REPAIR_AT + REBOOT_SECONDS, "resolved before the reboot ended"


RESTART_WATCH = 10.0  # Seconds (80 production seconds) of watching Alertmanager after vmalert restarts.


def _active(am_url: str) -> dict[frozenset, str]:
    """Each alert Alertmanager holds unresolved (inhibited ones too), with the start it keeps for it."""
    return {frozenset(a["labels"].items()): a["startsAt"] for a in alertmanager_alerts(am_url)}


def _restart_drill(restart: Callable[[], None], vm_am: str, prom_am: str) -> tuple[set, dict]:
    """vmalert stopped and started while its alerts fire. It reads its alerts' state back from the store, so
    every alert it had sent stays unresolved at Alertmanager with the same start: no resolved message and no
    second page. An alert that went pending again would stop being sent and resolve within three evaluations.

    Returns the required alerts watched, and those Alertmanager lost or restarted while Prometheus still fires
    them (an optional alert may resolve by itself in one engine and not yet in the other)."""
    before = {key: starts for key, starts in _active(vm_am).items()
              if any(e.required and e.matches(dict(key)) for e in EXPECTED)}
    started = time.monotonic()
    restart()
    print(f"vmalert restarted in {time.monotonic() - started:.1f}s with {len(before)} alerts at Alertmanager")
    changed: dict[frozenset, str | None] = {}
    deadline = time.monotonic() + RESTART_WATCH
    while time.monotonic() < deadline:
        now = _active(vm_am)
        changed.update({key: now.get(key) for key, starts in before.items() if now.get(key) != starts})
        time.sleep(0.5)
    firing = _active(prom_am)  # The fleet's truth: what resolved there resolved by itself.
    return set(before), {key: start for key, start in changed.items() if key in firing}


def _sharded_fleet(stack: contextlib.ExitStack, workdir: Path,
                   *simulate: str) -> tuple[Path, str, list[contextlib.ExitStack], list[set[str]], float]:
    """The simulator, one VictoriaMetrics, and the vmagent shards writing to it, entered on `stack`.

    Every node must be scraped by one shard only, and the large Slurm job (its straggler is node 13) must
    have nodes in every shard: its median and its straggler are then found only over the union. vmagent
    shares the targets out by a hash of their labels, the simulator's random port among them, so the job
    misses a shard in about one run in eight: then all of it starts again on another port, with fresh
    storage, at most ATTEMPTS times. Returns the targets file, the storage URL, each shard's own stack (to
    stop it alone) and its nodes, and when the simulator's clock, which the faults' start is on, began."""
    job = set(SIXTEEN_NODES["jobs"][0]["nodes"])
    for attempt in range(ATTEMPTS):
        here = workdir / f"attempt-{attempt}"
        here.mkdir(parents=True)
        with contextlib.ExitStack() as fleet:
            targets = here / "targets.json"
            fleet.enter_context(simulator(targets, *simulate))
            started = time.monotonic()
            # VictoriaMetrics shows samples a second after they arrive (30 s by default), as rules evaluated
            # eight times faster than production need.
            storage = fleet.enter_context(victoria_metrics(here / "storage", "-search.latencyOffset=1s",
                                                           "-loggerLevel=WARN")).url
            shards = [fleet.enter_context(contextlib.ExitStack()) for _ in range(SHARDS)]
            agents = [shards[n].enter_context(_vmagent(targets, storage, here / f"shard-{n}", n)).url
                      for n in range(SHARDS)]
            # A shard may hold no node at all (about one start in two hundred), so wait for the whole fleet
            # across the shards rather than for each shard to show a target.
            scraped = wait_for(lambda agents=agents: _whole_fleet([scraped_instances(a) for a in agents]), 30,
                               "every node at one vmagent shard")
            if all(shard & job for shard in scraped):
                stack.enter_context(fleet.pop_all())
                return targets, storage, shards, scraped, started
            print(f"attempt {attempt}: the job misses a shard: {scraped}")
    pytest.fail(f"in {ATTEMPTS} attempts, vmagent never spread job {job} over all {SHARDS} shards")


def _vmagent(targets: Path, storage: str, data: Path, shard: int) -> contextlib.AbstractContextManager[Server]:
    """vmagent shard `shard` of SHARDS in vmagent's cluster mode, scraping its share of the simulator's targets
    as job `gpufleet` every second into `storage`."""
    data.mkdir(parents=True, exist_ok=True)
    config = data / "vmagent.yml"
    config.write_text(yaml.safe_dump({
        "global": scrape_timing("1s"),
        "scrape_configs": [{"job_name": "gpufleet", "file_sd_configs": [{"files": [str(targets)]}]}],
    }))
    return vmagent(config, storage, data / "buffer", "-promscrape.fileSDCheckInterval=1s",
                   "-remoteWrite.flushInterval=500ms", "-loggerLevel=WARN", f"-promscrape.cluster.memberNum={shard}",
                   f"-promscrape.cluster.membersCount={SHARDS}")


def _alertmanager(workdir: Path, receiver: Receiver) -> contextlib.AbstractContextManager[Server]:
    """An Alertmanager with the production routing, delivering to `receiver`, its timers divided like the
    rules': PagerDuty incidents open and resolve as they would in production."""
    (workdir / "am").mkdir(parents=True)
    return alertmanager(workdir / "am", routing(workdir, receiver, TIME_SCALE))


def _vmalert(rules: Path, storage: str, alertmanager_url: str,
             port: int | None = None) -> contextlib.AbstractContextManager[Server]:
    """vmalert over `rules`, as compose runs it at the test's time scale.

    Its evaluation interval is what Prometheus's `evaluation_interval` is here (the scrape interval): the
    groups without their own interval run at it, where vmalert's default is a minute. Its `alertgroup` label
    is left off: the alerts then carry the labels Prometheus gives the same rules, and Alertmanager groups
    them alike. LOOKBACK is how long a series that stopped keeps its last value in a query
    (`-datasource.queryStep`, which VictoriaMetrics takes as the window of a bare selector), as Prometheus's
    lookback delta: VictoriaMetrics 1.79 has no staleness markers to end a vanished target's series sooner.
    Firing alerts are resent every production minute, as compose has it, so Alertmanager keeps each for four
    (30 s here) after the last send: at vmalert's default of four evaluation intervals (4 s here), a restart that
    took 8.9 s on a busy machine let Alertmanager resolve five standing alerts, which then started again.
    """
    return vmalert(rules, storage, alertmanager_url, "-evaluationInterval=1s", "-remoteWrite.flushInterval=500ms",
                   "-disableAlertgroupLabel", f"-datasource.queryStep={LOOKBACK}", "-loggerLevel=WARN",
                   f"-rule.resendDelay={60 / TIME_SCALE:g}s", port=port)


def _whole_fleet(scraped: list[set[str]]) -> list[set[str]] | None:
    """The shards' nodes once every node is scraped, by exactly one shard; None while some are not yet."""
    every = sorted(n for shard in scraped for n in shard)
    assert len(every) == len(set(every)), f"a node scraped by two shards: {scraped}"
    return scraped if every == [node(n) for n in range(1, 17)] else None


def wait_until_scraped(store: str, targets: int, started: float) -> None:
    """Until the engine has scraped each of its `targets` successfully, before the faults: the healthy phase is
    judged from the engine's own `up`, and a slow start shows here, printed, rather than as a healthy fleet's
    alert. Bounded by the faults' start: a fleet not up by then fails here, saying so."""
    wait_for(lambda: len(query(store, "up == 1")) >= targets, max(5.0, started + FAULTS_AT - 10 - time.monotonic()),
             f"all {targets} targets scraped")
    print(f"{store}: all {targets} targets scraped {time.monotonic() - started:.1f}s after the fleet started")


def _failed_scrapes(store: str, started: float) -> dict[str, list[float]]:
    """Each node with a scrape that failed (`up` 0) since `started`, by the engine's own scraper, and when (seconds
    since `started`): shown beside the alerts, a busy machine's lost scrapes tell a rule's truth from a fault's."""
    window = round(time.monotonic() - started) + 10
    epoch_of_started = time.time() - time.monotonic() + started
    failed = {r["metric"]["instance"]: [float(t) - epoch_of_started for t, v in r["values"] if float(v) == 0]
              for r in query(store, f"up[{window}s]")}
    return {instance: times for instance, times in failed.items() if times}


def _dark_to_the_engine(labels: dict[str, str], pending_at: float, failed_scrapes: dict[str, list[float]]) -> bool:
    """Whether an alert about nodes gone dark went pending because the engine's own scrapes of them had just failed
    (seconds since the fleet started): NodeExporterDown for its node, RackDown for as many of the rack's nodes as
    the rule counts."""
    def failed_just_before(instance: str) -> bool:
        return any(pending_at - DARK_LOOKBACK <= t <= pending_at for t in failed_scrapes.get(instance, []))

    if labels["alertname"] == "NodeExporterDown":
        return failed_just_before(labels["instance"])
    if labels["alertname"] == "RackDown":
        rack = [name for name, place in SIXTEEN_NODES_TOPOLOGY["nodes"].items() if place.get("rack") == labels["rack"]]
        config = Config()
        return sum(failed_just_before(name) for name in rack) >= max(config.rack_down_nodes,
                                                                     math.ceil(config.rack_down_share * len(rack)))
    return False


def _spells(times: list[float], gap: float = 1.5) -> str:
    """Times as spans, those less than `gap` apart joined: "120.1-127.3 (8 scrapes)"."""
    runs: list[list[float]] = []
    for t in sorted(times):
        if runs and t - runs[-1][-1] <= gap:
            runs[-1].append(t)
        else:
            runs.append([t])
    return ", ".join(f"{run[0]:.1f}-{run[-1]:.1f} ({len(run)} scrapes)" for run in runs)


def _check(engine: Engine, started: float, drills: list[Expected],
           failed_scrapes: dict[str, list[float]]) -> None:
    """What the engine reported and delivered, against EXPECTED and the `drills` it went through at the end.

    A scrape of a healthy node can fail on this busy machine (its 1 s interval leaves 0.9 s to answer), and then
    NodeExporterDown, or RackDown where the rack's other nodes missed theirs too, goes pending, as it should: that
    is the rule telling the truth, so it is shown and let pass where the engine's own `up` was 0 (see
    `_dark_to_the_engine`). Firing for a node that was not down still fails the test."""
    log, receiver = engine.log, engine.receiver
    faults_from = started + FAULTS_AT - 5
    seen = dict(log.seen.items())
    for key, (first, state) in list(seen.items()):
        labels = dict(key)
        if state == "pending" and not any(e.matches(labels) for e in EXPECTED) and _dark_to_the_engine(
                labels, first - started, failed_scrapes):
            print(f"{engine.name}: scrapes failed; {labels['alertname']} {labels.get('instance', labels.get('rack'))} "
                  f"pending at {first - started:.1f}s, never firing")
            del seen[key]
    report = f"{engine.name}:\n" + "\n".join(f"{first - started:6.1f}s {state:8} {dict(key)}" for key, (first, state)
                                             in sorted(seen.items(), key=lambda kv: kv[1][0]))
    report += "\nfailed scrapes, by the engine's own up:\n" + "\n".join(
        f"  {instance}: {_spells(times)}" for instance, times in sorted(failed_scrapes.items()))
    healthy = [dict(key) for key, (first, _) in seen.items() if first < faults_from]
    assert healthy == [], f"alerts on a healthy fleet:\n{report}"
    # Every alert about a node keeps its place, as every other alert of the node does: one group key at Alertmanager.
    places = SIXTEEN_NODES_TOPOLOGY["nodes"]
    misplaced = [dict(key) for key in seen if "instance" in dict(key) and any(
        dict(key).get(label) != value for label, value in places[dict(key)["instance"]].items())]
    assert misplaced == [], f"alerts of a node without its leaf and rack:\n{misplaced}"
    unexpected = [dict(key) for key in seen if not any(e.matches(dict(key)) for e in EXPECTED + drills)]
    told = "\n".join(f"{labels['alertname']} {labels.get('instance', '')}: "
                     f"{log.annotations.get(frozenset(labels.items()), {}).get('description', '')}"
                     for labels in unexpected)
    assert unexpected == [], f"alerts no fault explains:\n{told}\n{report}"
    # Time to detect, from the faults' start to each expected alert's first firing (shown with -s, and on failure).
    detected = sorted((min((fired - started - FAULTS_AT for key, fired in log.fired.items() if e.matches(dict(key))),
                           default=float("nan")), e.alertname, e.instance) for e in EXPECTED if e.required)
    print("\n".join(f"time to fire {spent:6.1f}s  {name} {instance}" for spent, name, instance in detected))
    received = "\n".join(f"{path}: {labels}" for path, labels in receiver.snapshot())
    report += "\nreceived:\n" + received
    for e in EXPECTED:
        if e.required:
            assert any(e.matches(dict(key)) and state == "firing" for key, (_, state) in seen.items()), (e, report)
    for e in EXPECTED:
        if e.required and e.receiver:
            assert any(e.matches(labels) and path == e.receiver for path, labels in receiver.snapshot()), (e, report)
    stray = [f"{at - started:6.1f}s {path}: {labels}" for at, path, labels in receiver.arrivals()
             if not any(e.matches(labels) and e.receiver == path for e in EXPECTED + drills)]
    assert stray == [], "deliveries no fault explains, or to the wrong receiver:\n" + "\n".join(stray) + f"\n{report}"
