"""A site's topology (each node's rack and leaf switch): read and checked, turned into scrape targets or
relabelling that a real Prometheus applies, and the simulator's leaf switch that goes down."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml

from gpufleet import cli, topology
from gpufleet.devtools.programs import prometheus, scrape_timing, simulator
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import wait_for
from gpufleet.simulator.faults import ScenarioError, parse_fault
from gpufleet.simulator.fleet import Fleet

from fleets import value
from helpers import parse
from layouts import node

FIXTURES = Path(__file__).parent / "fixtures"
PLACES = {"nodes": {node(1): {"rack": "r1", "leaf": "su1"}, node(2): {"rack": "r1", "leaf": "su1"},
                    node(3): {"rack": "r2", "leaf": "su2"}, node(4): {"rack": "r2", "leaf": "su2"}}}


@pytest.fixture
def places(tmp_path):
    path = tmp_path / "topology.yml"
    path.write_text(yaml.safe_dump(PLACES))
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("[a, b]", "expected a mapping with one key, 'nodes'"),
    ("nodes: {gpu-node-0001: r1}", "gpu-node-0001: expected labels such as"),
    ("nodes: {gpu-node-0001: {instance: x}}", "gpu-node-0001: 'instance' is not a label a topology may set"),
    ("nodes: {gpu-node-0001: {leaf: ''}}", "gpu-node-0001: leaf must be a name"),
    ("nodes: {gpu-node-0001: {leaf: [a]}}", "gpu-node-0001: leaf must be a name"),
])
def test_a_bad_topology_is_refused_naming_the_node(tmp_path, capsys, text, message):
    path = tmp_path / "topology.yml"
    path.write_text(text)
    assert cli.main(["alerts", "topology", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_file_sd_gives_each_node_its_place(places, capsys):
    assert cli.main(["alerts", "topology", str(places), "--port=9400", "--label=cluster=a"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert entries == [
        {"targets": [f"{node(1)}:9400", f"{node(2)}:9400"], "labels": {"cluster": "a", "leaf": "su1", "rack": "r1"}},
        {"targets": [f"{node(3)}:9400", f"{node(4)}:9400"], "labels": {"cluster": "a", "leaf": "su2", "rack": "r2"}}]


FABRIC = FIXTURES / "ibnetdiscover" / "fabric.txt"


def test_the_fabric_places_each_host_at_its_leaf_and_its_draft_is_a_topology_file(tmp_path, capsys):
    """Two rail-optimised scalable units of two hosts and two rails (one host's first rail down, one unit's
    second leaf a chassis line card as `ibnetdiscover -g` writes it), a storage leaf every host also reaches, a
    host on a leaf left at its factory name, an HCA whose description rdma-ndd never set, and a damaged line."""
    assert cli.main(["alerts", "topology", f"--ibnetdiscover={FABRIC}", "--device-exclude=mlx5_8",
                     "--format=yaml"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out) == {"nodes": {
        node(1): {"leaf": "su1-leaf-r1"}, node(2): {"leaf": "su1-leaf-r1"},  # Node 2 by its second rail.
        node(3): {"leaf": "su2-leaf-r1"}, node(4): {"leaf": "su2-leaf-r1"},
        node(5): {"leaf": "S-00000000000000d1"}}}  # Its name is the spines' too: its GUID names it.
    assert err.splitlines() == [
        "gpufleet alerts topology: left out 'MT4129 ConnectX7 Mellanox Technologies' on storage-leaf-1: "
        "not HOST DEVICE",
        "gpufleet alerts topology: left out '[6]\\t\"H-b8cef603000f0002\"[1]\\t\\tgpu-node-0009 mlx5_8 lid 7 4xNDR' on "
        "storage-leaf-1: not a switch port as ibnetdiscover writes one"]
    draft = tmp_path / "topology.yml"
    draft.write_text(out)
    assert topology.load(draft).nodes[node(3)] == {"leaf": "su2-leaf-r1"}

    assert cli.main(["alerts", "topology", f"--ibnetdiscover={FABRIC}", "--format=yaml"]) == 0
    placed = yaml.safe_load(capsys.readouterr().out)["nodes"]  # The storage leaf, not excluded, comes first.
    assert {places["leaf"] for places in placed.values()} == {"storage-leaf-1", "S-00000000000000d1"}


@pytest.mark.parametrize(("arguments", "message"), [
    ([], "give either a TOPOLOGY file or --ibnetdiscover FILE"),
    ([f"--ibnetdiscover={FIXTURES / 'kmsg' / 'xid.log'}"], "no switch port leads to an HCA named HOST DEVICE"),
    (["--ibnetdiscover=/nonexistent/fabric.txt"], "cannot read"),
])
def test_a_fabric_that_cannot_be_read_is_refused(capsys, arguments, message):
    assert cli.main(["alerts", "topology", *arguments]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.e2e
def test_prometheus_relabelling_puts_each_nodes_place_on_its_series(tmp_path, places):
    """For a site with its own service discovery: the relabelling `gpufleet alerts topology --format relabel`
    writes, applied by a real Prometheus to the simulator's targets (named by `instance`)."""
    relabel = yaml.safe_load(topology.relabel_configs(topology.load(places), "instance"))
    targets = tmp_path / "targets.json"
    with contextlib.ExitStack() as stack:
        stack.enter_context(simulator(targets, "--nodes=5", "--collect-interval=1s"))
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": scrape_timing("1s"), "scrape_configs": [
            {"job_name": "gpufleet", "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
             "relabel_configs": relabel}]}))
        url = stack.enter_context(prometheus(config, tmp_path / "data")).url
        placed = wait_for(lambda: len(found := query(url, "up")) == 5 and found, 30, "five targets scraped")
    labels = {r["metric"]["instance"]: (r["metric"].get("rack"), r["metric"].get("leaf")) for r in placed}
    assert labels == {node(1): ("r1", "su1"), node(2): ("r1", "su1"), node(3): ("r2", "su2"),
                      node(4): ("r2", "su2"), node(5): (None, None)}  # Not in the topology: no place.


async def test_a_switch_down_takes_down_its_leafs_nodes_and_no_other():
    fleet = Fleet(node_count=4, seed=1)
    try:
        fleet.place(PLACES["nodes"])
        fleet.add([parse_fault({"kind": "switch_down", "leaf": "su1", "port": "mlx5_2/1", "start": 10},
                               "test", "s1", fleet.nodes, 8)])
        wall = iter(range(0, 10**6, 100)).__next__
        states = {}
        for name, member in fleet.nodes.items():
            samples = parse(await member.scrape(20.0, wall))
            states[name] = {device: value(samples, "gpufleet_infiniband_state_id", device=device)
                            for device in ("mlx5_1", "mlx5_2")}
        assert states == {node(1): {"mlx5_1": 4, "mlx5_2": 1}, node(2): {"mlx5_1": 4, "mlx5_2": 1},
                          node(3): {"mlx5_1": 4, "mlx5_2": 4}, node(4): {"mlx5_1": 4, "mlx5_2": 4}}
        with pytest.raises(ScenarioError, match="leaf 'su9' is not one of the topology's \\(su1, su2\\)"):
            parse_fault({"kind": "switch_down", "leaf": "su9"}, "test", "s2", fleet.nodes, 8)
        with pytest.raises(ScenarioError, match="a switch_down takes the leaf behind which its nodes are"):
            parse_fault({"kind": "switch_down", "leaf": "su1", "node": node(1)}, "test", "s3", fleet.nodes, 8)
    finally:
        fleet.close()
