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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

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
FAULTS_AT = 60  # Simulated (and, at speed 1, wall-clock) seconds of healthy fleet first.
LOOKBACK = f"{round(300 / TIME_SCALE)}s"  # vmalert's 5 minutes for a series that stopped, scaled like the windows.
RESTART_AT = 95  # Simulated seconds: node 1's exporter restarts, its GPU 1 held at a reset.
REPAIR_AT = 120  # The repairs start.
SWITCH_AT = 150  # A leaf switch goes down, once the repairs are done, and is back before the drills.
# A reboot of 20 seconds is 2.7 production minutes: shorter than NodeExporterDown's `for`, as a planned reboot.
REBOOT_SECONDS = 20
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@dataclass(frozen=True)
class Expected:
    alertname: str
    instance: str | None  # None: an alert about a whole cluster.
    labels: tuple[tuple[str, str], ...] = ()
    receiver: str | None = None  # None: fires in Prometheus but reaches nobody (info, or inhibited).
    required: bool = True  # False: may fire on the way to the real alert (a flap starts with one link-down).

    def matches(self, labels: dict[str, str]) -> bool:
        return (labels.get("alertname") == self.alertname and labels.get("instance") == self.instance
                and all(labels.get(k) == v for k, v in self.labels))


def expect(alertname: str, number: int, receiver: str | None, required: bool = True, **labels: str) -> Expected:
    return Expected(alertname, node(number), tuple(sorted(labels.items())), receiver, required)


# The layout given to the simulator (layouts.SIXTEEN_NODES): slurm 944279 on nodes 1, 2, 3, 6, 8, 11, 13, 14;
# a Kubernetes job on 4, 9, 12, 16; slurm 432958 on 10 and 15; nodes 5 and 7 idle.
SCENARIO: list[tuple[dict, list[Expected]]] = [
    # A GPU that needs something pages (or tickets) from the recovery action the exporter holds for it; the XID
    # and ECC events themselves reach nobody.
    ({"kind": "xid", "node": node(1), "gpu": 0, "xid": 79},
     [expect("GpuNeedsReboot", 1, "pager", gpu="0"), expect("GpuXidCritical", 1, None, gpu="0", xid="79")]),
    ({"kind": "ecc_dbe", "node": node(1), "gpu": 1},
     [expect("GpuNeedsReset", 1, "pager", gpu="1"), expect("GpuEccUncorrectable", 1, None, gpu="1"),
      expect("GpuXidCritical", 1, None, gpu="1", xid="48")]),
    ({"kind": "xid", "node": node(2), "gpu": 4, "xid": 13},
     [expect("GpuXidApplication", 2, None, gpu="4", xid="13")]),
    ({"kind": "row_remap_pending", "node": node(2), "gpu": 2},
     [expect("GpuRowRemapPending", 2, "ticket", gpu="2")]),
    ({"kind": "pcie_replay_storm", "node": node(2), "gpu": 3},
     [expect("GpuPcieReplaysHigh", 2, "ticket", gpu="3")]),
    ({"kind": "row_remap_failure", "node": node(3), "gpu": 0},
     [expect("GpuNeedsReplacement", 3, "ticket", gpu="0"), expect("GpuXidCritical", 3, None, gpu="0", xid="64")]),
    ({"kind": "thermal_slowdown", "node": node(6), "gpu": 1},
     [expect("GpuHardwareSlowdown", 6, "ticket", gpu="1", reason="hw_thermal_slowdown"),
      expect("GpuThermalMarginLow", 6, "ticket", gpu="1"),
      # One GPU of eight at 60 % clock brings the node's mean clock 5 % below its peers': about the edge.
      expect("NodeStraggler", 6, "ticket", required=False)]),
    ({"kind": "nvlink_down", "node": node(6), "gpu": 2, "link": 3},
     [expect("GpuNvlinkDown", 6, "pager", gpu="2", link="3")]),
    ({"kind": "power_brake", "node": node(8), "gpu": 0},
     [expect("GpuHardwareSlowdown", 8, "ticket", gpu="0", reason="hw_power_brake_slowdown"),
      expect("GpuHardwareSlowdown", 8, "ticket", gpu="0", reason="hw_slowdown"),
      # One GPU at half clock and power: the node's mean 6 % below its peers', so it may straggle.
      expect("NodeStraggler", 8, "ticket", required=False)]),
    ({"kind": "nvlink_crc", "node": node(8), "gpu": 1, "link": 4},
     [expect("GpuNvlinkCrcErrors", 8, "ticket", gpu="1", link="4")]),
    # A GPU the NVSwitch fabric manager never finishes registering pages; a fabric at limited capacity tickets.
    ({"kind": "fabric_not_ready", "node": node(10), "gpu": 6},
     [expect("GpuFabricNotReady", 10, "pager", gpu="6")]),
    ({"kind": "fabric_degraded", "node": node(14), "gpu": 2},
     [expect("GpuFabricDegraded", 14, "ticket", gpu="2")]),
    ({"kind": "nic_saturation", "node": node(11), "port": "mlx5_1/1", "direction": "tx"},
     [expect("NicSaturatedTrainingJob", 11, "ticket", device="mlx5_1", direction="transmit", job_id="944279"),
      # Not the plain ticket: it stands aside while the latest utilisation meets the job's ticket's condition.
      # It may go pending where a dip of the 5-minute rate below 95% lets it, and must reach no one.
      expect("NicSaturated", 11, None, required=False, device="mlx5_1", direction="transmit")]),
    ({"kind": "ib_congestion", "node": node(13), "port": "mlx5_2/1"},
     [expect("NicInfinibandCongested", 13, "ticket", device="mlx5_2"),
      # Its port waits far more than its job's median node's: its collectives hold the job back.
      expect("NodeStraggler", 13, "ticket", signal="infiniband_xmit_wait", job_id="944279")]),
    ({"kind": "symbol_errors", "node": node(14), "port": "mlx5_3/1"},
     [expect("NicInfinibandSymbolErrors", 14, "ticket", device="mlx5_3")]),
    ({"kind": "straggler", "node": node(4)},
     # The simulator's pods have no names (no kubelet answers), so no job id: the job's nodes are compared as busy
     # nodes of one GPU model, on their SM clock.
     [expect("NodeStraggler", 4, "ticket", signal="sm_clock", peers="model")]),
    # Slurm job 432958 hangs: both its nodes spin in a collective (its straggler tests are the promtool tests').
    ({"kind": "job_hang", "node": node(10)}, [Expected("JobHung", None, (("job_id", "432958"),), "pager")]),
    ({"kind": "ib_link_down", "node": node(9), "port": "mlx5_4/1"},
     [expect("NicInfinibandPortDown", 9, "pager", device="mlx5_4")]),  # No link-down ticket beside the page.
    ({"kind": "ib_link_flap", "node": node(12), "port": "mlx5_5/1"},
     [expect("NicInfinibandLinkFlapping", 12, "pager", device="mlx5_5"),
      # The link-down warning waits for the link to stay up: it may go pending between downs, reaching no one.
      expect("NicInfinibandLinkDowned", 12, None, required=False, device="mlx5_5"),
      # Down half of the time, so "port down" may go pending; its 2m `for` outlasts each 10 s down.
      expect("NicInfinibandPortDown", 12, None, required=False, device="mlx5_5")]),
    ({"kind": "ib_rate_degraded", "node": node(16), "port": "mlx5_6/1"},
     [expect("NicInfinibandRateDegraded", 16, "pager", device="mlx5_6")]),
    ({"kind": "gpu_lost", "node": node(15), "gpu": 5},
     # One page: the reboot the GPU needs, which holds back the lost GPU's own page.
     [expect("GpuNeedsReboot", 15, "pager", gpu="5"), expect("GpuLost", 15, None, gpu="5"),
      expect("GpuXidCritical", 15, None, gpu="5", xid="79"),
      # The GPU collector fails while a board is lost; the page for the lost GPU holds back these tickets.
      # The reboot 60 seconds later may end the failure before its 75-second `for`.
      expect("NodeCollectorFailing", 15, None, required=False, collector="gpu"),
      expect("NodeCollectorStale", 15, None, collector="gpu"),
      # When the reboot brings the GPU back, the lost GPU's alert resolves at the scrape interval and the stale
      # collector's ticket only at the next minute group: in between, nothing holds the ticket back, and it can
      # reach the ticket queue for that moment.
      expect("NodeCollectorStale", 15, "ticket", required=False, collector="gpu")]),
    ({"kind": "exporter_down", "node": node(5)}, [expect("NodeExporterDown", 5, "pager")]),
    # 24 production seconds between exporter processes on a busy node: "exporter down" may go pending, and
    # nothing reaches anyone. (An XID raised while no exporter runs is lost, so it is a node with none.)
    ({"kind": "exporter_restart", "node": node(11), "duration": "3s"},
     [expect("NodeExporterDown", 11, None, required=False)]),
    # Node 1's exporter restarts while its GPU 1 is held at a reset: the page must stay open through it.
    ({"kind": "exporter_restart", "node": node(1), "start": f"{RESTART_AT}s", "duration": "3s"},
     [expect("NodeExporterDown", 1, None, required=False)]),
    # The repairs: each ends its GPU's page, and nothing else (node 1's GPU 0 still needs its reboot).
    # Off the bus while it resets (40 production seconds): "lost" and the GPU collector's failure may go
    # pending, and reach no one.
    ({"kind": "gpu_reset", "node": node(1), "gpu": 1, "start": f"{REPAIR_AT}s"},
     [expect("GpuLost", 1, None, required=False, gpu="1"),
      expect("NodeCollectorFailing", 1, None, required=False, collector="gpu"),
      expect("NodeCollectorStale", 1, None, required=False, collector="gpu")]),
    ({"kind": "node_reboot", "node": node(15), "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("NodeExporterDown", 15, None, required=False)]),
    ({"kind": "gpu_replace", "node": node(3), "gpu": 0, "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("NodeExporterDown", 3, None, required=False)]),
    # A GPU taken out of an idle node on purpose, during a reboot: an inventory ticket, and no page.
    ({"kind": "gpu_removed", "node": node(7), "gpu": 3, "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("GpuCountDropped", 7, "ticket"), expect("NodeExporterDown", 7, None, required=False)]),
    # The leaf switches of one rail go down for 30 seconds (four production minutes), taking that link of all
    # sixteen nodes: one page naming the leaf and the rail, and none for the nodes, whose own alerts it holds
    # back.
    ({"kind": "switch_down", "leaf": "su1", "port": "mlx5_7/1", "start": f"{SWITCH_AT}s", "duration": "30s"},
     [Expected("FabricLeafDown", None, (("device", "mlx5_7"), ("leaf", "su1")), "pager"),
      *(expect("NicInfinibandPortDown", number, None, required=False, device="mlx5_7") for number in range(1, 17)),
      # Beside node_exporter (test_node_exporter), node 5, whose gpufleet exporter is down, still shows its link
      # going down and back, though not as down: gpufleet's word that the port was ever ACTIVE is gone. Its
      # link-down ticket is held back by the node's NodeExporterDown page.
      expect("NicInfinibandLinkDowned", 5, None, required=False, device="mlx5_7")]),
]
# Each repair, the alert it must end and when (simulated seconds): held until then, across the restart. A new
# board ends its old UUID's series rather than setting it to 0, and VictoriaMetrics, without staleness markers,
# keeps a vanished series for LOOKBACK: vmalert sees that one end so much later.
REPAIRED = [(expect("GpuNeedsReset", 1, "pager", gpu="1"), REPAIR_AT + 5, False),
            (expect("GpuNeedsReboot", 15, "pager", gpu="5"), REPAIR_AT + REBOOT_SECONDS, False),
            (expect("GpuNeedsReplacement", 3, "ticket", gpu="0"), REPAIR_AT + REBOOT_SECONDS, True)]
UNREPAIRED = expect("GpuNeedsReboot", 1, "pager", gpu="0")
EXPECTED = [e for _, alerts in SCENARIO for e in alerts]
# The drill at the end: a vmagent shard stopped takes its nodes out of vmalert's sight.
UNSCRAPED = Expected("NodesUnscraped", None, (("cluster", "e2e"),), "pager")


def test_the_scenario_covers_every_fault_kind():
    assert {fault["kind"] for fault, _ in SCENARIO} == set(KINDS)


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

        def restart_vmalert() -> None:
            evaluating.close()
            evaluating.enter_context(_vmalert(vmalert_rules, storage, vm_am, port=int(vmalert_url.rsplit(":", 1)[1])))
        engines = [Engine("prometheus", AlertLog(prom_url), receivers["prometheus"], prom_url),
                   Engine("vmalert", AlertLog(vmalert_url), receivers["vmalert"], storage)]
        try:
            _wait_for_deliveries_and_repairs(engines, started)
            kept, lost = _restart_drill(restart_vmalert, vm_am, prom_am)
            # A shard lost, with no replica: its nodes vanish from the store, and one page says what share.
            dark = min((number for number in range(SHARDS) if len(scraped[number]) >= 2), key=lambda n: len(scraped[n]))
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
    """Each repaired GPU's alert fired once, without a break through node 1's exporter restart or the repaired
    node's reboot, and ended once its repair was done; node 1's GPU 0, never rebooted, still needs it."""
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
    still = [spells for key, spells in engine.log.episodes.items() if UNREPAIRED.matches(dict(key))]
    assert len(still) == 1 and len(still[0]) == 1, still
    assert still[0][0][1] > started + REPAIR_AT + REBOOT_SECONDS + 40, still


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
    """
    return vmalert(rules, storage, alertmanager_url, "-evaluationInterval=1s", "-remoteWrite.flushInterval=500ms",
                   "-disableAlertgroupLabel", f"-datasource.queryStep={LOOKBACK}", "-loggerLevel=WARN", port=port)


def _whole_fleet(scraped: list[set[str]]) -> list[set[str]] | None:
    """The shards' nodes once every node is scraped, by exactly one shard; None while some are not yet."""
    every = sorted(n for shard in scraped for n in shard)
    assert len(every) == len(set(every)), f"a node scraped by two shards: {scraped}"
    return scraped if every == [node(n) for n in range(1, 17)] else None


def _failed_scrapes(store: str, started: float) -> set[str]:
    """The nodes with a scrape that failed (`up` 0) at some time since `started`, by the engine's own scraper."""
    window = round(time.monotonic() - started) + 10
    return {r["metric"]["instance"] for r in query(store, f"min_over_time(up[{window}s]) == 0")}


def _check(engine: Engine, started: float, drills: list[Expected], failed_scrapes: set[str]) -> None:
    """What the engine reported and delivered, against EXPECTED and the `drills` it went through at the end.

    A scrape of a healthy node can fail on this busy machine (its 1 s interval leaves 0.9 s to answer), and then
    NodeExporterDown goes pending, as it should: that is the rule telling the truth, so it is shown and let pass
    where the engine's own `up` was 0. Firing for a node that was not down still fails the test."""
    log, receiver = engine.log, engine.receiver
    faults_from = started + FAULTS_AT - 5
    seen = dict(log.seen.items())
    for key, (first, state) in list(seen.items()):
        labels = dict(key)
        if (labels["alertname"] == "NodeExporterDown" and state == "pending"
                and labels["instance"] in failed_scrapes and not any(e.matches(labels) for e in EXPECTED)):
            print(f"{engine.name}: a scrape of {labels['instance']} failed; NodeExporterDown pending at "
                  f"{first - started:.1f}s, never firing")
            del seen[key]
    report = f"{engine.name}:\n" + "\n".join(f"{first - started:6.1f}s {state:8} {dict(key)}" for key, (first, state)
                                             in sorted(seen.items(), key=lambda kv: kv[1][0]))
    healthy = [dict(key) for key, (first, _) in seen.items() if first < faults_from]
    assert healthy == [], f"alerts on a healthy fleet:\n{report}"
    unexpected = [dict(key) for key in seen if not any(e.matches(dict(key)) for e in EXPECTED + drills)]
    assert unexpected == [], f"alerts no fault explains:\n{report}"
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
    for path, labels in receiver.snapshot():
        assert any(e.matches(labels) and e.receiver == path for e in EXPECTED + drills), (path, labels, report)
