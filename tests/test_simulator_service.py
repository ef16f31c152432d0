"""`gpufleet simulate` as a service: a real Prometheus scrapes it through file_sd; the control API changes faults."""

import asyncio
import json
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from gpufleet.devtools import programs
from gpufleet.devtools.net import http
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import wait_for
from gpufleet.simulator.faults import Fault
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.server import build_app, list_faults

from helpers import parse
from layouts import nodes, write


@pytest.fixture
def simulator(tmp_path):
    scenario = tmp_path / "scenario.yml"
    scenario.write_text("faults:\n  - {kind: exporter_down, node: gpu-node-0004, start: 0}\n")
    layout = write(tmp_path / "layout.yml", {"jobs": [{"id": "5150", "scheduler": "slurm", "nodes": nodes(1, 2)}]})
    targets = tmp_path / "targets.json"
    with programs.simulator(targets, "--nodes", "4", "--cluster=ci", "--label=region=lab", f"--scenario={scenario}",
                            "--seed=5", f"--layout={layout}", "--collect-interval=2s", timeout=20) as running:
        yield running.url, targets


@pytest.fixture
def prometheus(tmp_path, simulator):
    _, targets = simulator
    config = programs.prometheus_config(tmp_path / "prometheus.yml", targets, "1s")
    with programs.prometheus(config, tmp_path / "data") as server:
        yield server.url


@pytest.mark.slow
@pytest.mark.e2e
def test_prometheus_scrapes_the_fleet_through_file_sd(simulator, prometheus):
    _, targets = simulator
    listed = json.loads(targets.read_text())
    assert [t["labels"]["instance"] for t in listed] == [f"gpu-node-{i:04d}" for i in range(1, 5)]
    paths = {t["labels"]["__metrics_path__"] for t in listed}
    assert paths == {f"/nodes/gpu-node-{i:04d}/metrics" for i in range(1, 5)}

    def all_scraped():
        result = query(prometheus, "up")
        return result if len(result) == 4 else None

    up = {r["metric"]["instance"]: float(r["value"][1]) for r in wait_for(all_scraped, 60, "four targets")}
    assert up == {"gpu-node-0001": 1, "gpu-node-0002": 1, "gpu-node-0003": 1, "gpu-node-0004": 0}  # 0004 is "down".
    labels = query(prometheus, 'up{instance="gpu-node-0001"}')[0]["metric"]
    assert labels["cluster"] == "ci" and labels["region"] == "lab" and labels["job"] == "gpufleet"

    def gpus():
        result = query(prometheus, "count by (instance) (gpufleet_gpu_up == 1)")
        return result if len(result) == 3 else None

    assert {r["metric"]["instance"]: r["value"][1] for r in wait_for(gpus, 30, "GPU series")} == {
        "gpu-node-0001": "8", "gpu-node-0002": "8", "gpu-node-0003": "8"}
    # Job attribution reaches Prometheus too, as the layout gave it: rules can group nodes by job.
    jobs = query(prometheus, "count by (job_id) (gpufleet_gpu_job_info)")
    assert [(r["metric"]["job_id"], r["value"][1]) for r in jobs] == [("5150", "16")]


@pytest.mark.slow
@pytest.mark.e2e
def test_snapshots_stay_fresh_between_scrapes(simulator):
    url, _ = simulator

    def energy():
        samples = parse(http("GET", f"{url}/nodes/gpu-node-0001/metrics")[1])
        return sum(v for (n, _), v in samples.items() if n == "gpufleet_gpu_energy_joules_total")

    first = energy()
    wait_for(lambda: energy() > first, 15, "a newer collection of gpu-node-0001")


@pytest.mark.slow
@pytest.mark.e2e
def test_the_control_api_adds_lists_and_removes_faults(simulator):
    url, _ = simulator
    status, body = http("POST", f"{url}/control/faults",
                        [{"kind": "xid", "node": "gpu-node-0002", "gpu": 6, "xid": 94},
                         {"kind": "pcie_replay_storm", "node": "gpu-node-0002", "gpu": 1, "start": "+0s"}])
    assert status == 201, body
    added = [f["id"] for f in json.loads(body)["added"]]

    def xid_counted():
        samples = parse(http("GET", f"{url}/nodes/gpu-node-0002/metrics")[1])
        return [v for (n, l), v in samples.items() if n == "gpufleet_gpu_xid_errors_total" and ("xid", "94") in l]

    assert wait_for(xid_counted, 20, "XID 94 on /metrics") == [1.0]
    listed = json.loads(http("GET", f"{url}/control/faults")[1])["faults"]
    assert {f["id"] for f in listed} >= set(added)
    assert http("DELETE", f"{url}/control/faults/{added[1]}")[0] == 200
    assert http("DELETE", f"{url}/control/faults/nope")[0] == 404
    status, body = http("POST", f"{url}/control/faults", {"kind": "xid", "node": "gpu-node-0002", "gpu": 6})
    assert status == 400 and b"kind xid needs 'xid'" in body
    assert http("POST", f"{url}/control/faults", "not a fault")[0] == 400
    assert http("GET", f"{url}/nodes/gpu-node-0099/metrics")[0] == 404


async def test_the_control_api_refuses_remote_clients_unless_allowed():
    fleet = Fleet(node_count=1)
    try:
        transport = mock.Mock()
        transport.get_extra_info.return_value = ("10.1.2.3", 40000)
        def request(allowed: bool):
            app = build_app(fleet, lambda: 0.0, allow_remote_control=allowed)
            return make_mocked_request("GET", "/control/faults", app=app, transport=transport)

        with pytest.raises(web.HTTPForbidden):
            await list_faults(request(allowed=False))
        assert (await list_faults(request(allowed=True))).status == 200
    finally:
        fleet.close()


async def test_a_down_exporter_does_not_answer_and_the_others_do():
    fleet = Fleet(node_count=2)
    fleet.add([Fault("d", "exporter_down", "gpu-node-0002", 0.0)])
    fleet.start()
    client = TestClient(TestServer(build_app(fleet, lambda: 10.0), host="127.0.0.1"))  # Held for 60 s.
    await client.start_server()
    try:
        held = asyncio.create_task(client.get("/nodes/gpu-node-0002/metrics"))
        up = await client.get("/nodes/gpu-node-0001/metrics")
        # The other node answers while the down one still holds its scrape, as a hung exporter would.
        assert up.status == 200 and not held.done()
        assert parse(await up.read())[("gpufleet_gpu_devices", frozenset())] == 8
        done, _ = await asyncio.wait({held}, timeout=0.5)
        assert not done, "the down node answered"
        held.cancel()  # The scraper gives up.
    finally:
        await client.close()
        await asyncio.to_thread(fleet.close)
