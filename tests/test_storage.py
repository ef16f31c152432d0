"""Storage timeouts named by their server: the kernel collector's count per NFS server or Lustre target, bounded
whatever the log says."""

import contextlib
import time

import pytest
import yaml

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import render
from gpufleet.devtools.delivery import Receiver, alertmanager_alerts, routing
from gpufleet.devtools.programs import alertmanager, prometheus, prometheus_config, simulator
from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter.collector.kernel import MAX_STORAGE_SERVERS, KernelCollector, storage_server
from gpufleet.simulator.kernel_log import SimulatedKernelLog

from helpers import named, rendered
from layouts import node


def test_a_timeout_names_the_nfs_server_or_lustre_target_it_lost():
    assert storage_server("nfs: server nfs-home.example.com not responding, still trying") == "nfs-home.example.com"
    assert storage_server("Lustre: scratch-OST001a-osc-ffff8810: Connection to scratch-OST001a (at 10.0.0.5@o2ib) "
                          "was lost; in progress operations using this service will wait for recovery to complete"
                          ) == "scratch-OST001a"
    assert storage_server("LustreError: 11-0: scratch-MDT0000-mdc-ffff8810: operation mds_getattr to node "
                          "10.0.0.9@o2ib timed out") == "scratch-MDT0000"
    assert storage_server("LustreError: 166-1: MGC10.0.0.1@o2ib: Connection to MGS (at 10.0.0.1@o2ib) was lost; "
                          "in progress operations using this service will fail") == "MGS"
    assert storage_server("LustreError: request timed out") == "unknown"


def test_servers_past_the_bound_count_as_other():
    log = SimulatedKernelLog()
    collector = KernelCollector(log)
    collector.start()
    log.messages += [f"nfs: server s{n} not responding, still trying" for n in range(MAX_STORAGE_SERVERS + 3)]
    log.messages += ["nfs: server s0 not responding, still trying"]
    counts = {dict(labels)["server"]: value for labels, value in
              named(rendered(collector.collect()), "gpufleet_kernel_storage_timeouts_total").items()}
    assert counts == {**{f"s{n}": 1 for n in range(1, MAX_STORAGE_SERVERS)}, "s0": 2, "other": 3}


TIME_SCALE = 8  # The outage's window of 5 minutes is 37.5 s, the kernel tickets' 30 minutes 225 s.
CLUSTER_NODES = 64


@pytest.mark.slow
@pytest.mark.e2e
def test_an_outage_on_a_tenth_of_a_cluster_pages_once_and_one_node_tickets(tmp_path):
    """Two simulated clusters under one Prometheus (the generated rules at time scale 8) and Alertmanager (the
    production routing): in one of 64 nodes, a tenth log NFS timeouts together, which pages once, naming the server,
    and opens none of their tickets; in another, one node does alone, which opens its ticket and pages nobody."""
    outage = [node(n) for n in range(1, CLUSTER_NODES // 10 + 2)]  # 7 of 64 nodes.
    timeouts = {"kind": "kernel_events", "event": "storage_timeout", "rate": 0.1, "start": "10s"}
    targets = {}
    for cluster, nodes, hit in (("a", CLUSTER_NODES, outage), ("b", 8, [node(3)])):
        scenario = tmp_path / f"{cluster}.yml"
        scenario.write_text(yaml.safe_dump({"faults": [{**timeouts, "node": name} for name in hit]}))
        targets[cluster] = (tmp_path / f"{cluster}.json", nodes, scenario)
    rules = tmp_path / "rules.yml"
    rules.write_text(render(Config().scaled(TIME_SCALE)))
    receiver = Receiver()
    (tmp_path / "am").mkdir()
    with contextlib.ExitStack() as stack:
        for cluster, (path, nodes, scenario) in targets.items():
            stack.enter_context(simulator(path, f"--nodes={nodes}", f"--cluster={cluster}", "--seed=0",
                                          "--collect-interval=2s", f"--scenario={scenario}", timeout=120))
        am = stack.enter_context(alertmanager(tmp_path / "am", routing(tmp_path, receiver, TIME_SCALE)))
        config = prometheus_config(tmp_path / "prometheus.yml", tmp_path / "*.json", "1s", rules, am.url)
        stack.enter_context(prometheus(config, tmp_path / "data"))
        started = time.monotonic()

        def delivered() -> bool:
            return bool(_sent(receiver, "pager", "NodesStorageTimeouts") and _sent(receiver, "ticket",
                                                                                  "NodeKernelEventsRepeated"))

        wait_for(delivered, 240, "the outage's page and the lone node's ticket")
        print(f"page and ticket {time.monotonic() - started:.0f}s after Prometheus started")
        time.sleep(45)  # One more evaluation of the kernel group (37.5 s): a held ticket would have come by now.
        held = [a for a in alertmanager_alerts(am.url) if a["labels"]["alertname"] == "NodesStorageTimeouts"]
    pages = [(key, [a.get("alertname") for page in pages for a in page.alerts]) for key, pages in receiver.incidents()]
    assert [names for _, names in pages if "NodesStorageTimeouts" in names] == [["NodesStorageTimeouts"]], pages
    assert {a["cluster"] for a in _sent(receiver, "pager", "NodesStorageTimeouts")} == {"a"}
    assert {(a["cluster"], a["instance"]) for a in _sent(receiver, "ticket", "NodeKernelEventsRepeated")} == {
        ("b", node(3))}
    description = held[0]["annotations"]["description"]
    assert description.startswith(f"{len(outage)} nodes of a logged storage timeouts within 5m, naming nfs-home "
                                  f"({len(outage)} nodes): "), description
    assert description.endswith(f"Nodes: {', '.join(outage)}."), description


def _sent(receiver: Receiver, path: str, alertname: str) -> list[dict[str, str]]:
    return [labels for to, labels in receiver.snapshot() if to == path and labels.get("alertname") == alertname]
