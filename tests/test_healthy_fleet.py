"""What a healthy fleet does that a static one does not: jobs end and others start on the same nodes, an
exporter restarts and its own counters start again, and a scrape now and then fails. The detection
bench's long healthy run stands on these; each is checked here on what a scrape returns."""

from __future__ import annotations

import asyncio
import itertools

from aiohttp.test_utils import TestClient, TestServer

from gpufleet.simulator.faults import Fault
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.layout import Job
from gpufleet.simulator.server import build_app, missed_scrapes

from helpers import parse

NODES = tuple(f"gpu-node-000{i}" for i in range(1, 9))
JOB = Job("424242", "slurm", NODES, period=40.0, comm_fraction=0.3)


def _wall() -> itertools.count:
    return itertools.count(0, 100)  # Every collector is due at every read.


def job_ids(samples: dict) -> set[str]:
    return {dict(labels)["job_id"] for (name, labels), _ in samples.items() if name == "gpufleet_gpu_job_info"}


def total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


async def test_jobs_end_and_new_ones_take_most_of_their_nodes_while_counters_keep_counting():
    fleet = Fleet(node_count=8, seed=4, layout=[JOB], job_lifetime=600.0)
    wall = _wall().__next__
    try:
        seen: dict[str, set[str]] = {}  # job id -> nodes seen running it
        idle_reads = 0
        energy = dict.fromkeys(NODES, 0.0)
        for t in range(0, 7200, 120):
            for name in NODES:
                samples = parse(await fleet.nodes[name].scrape(float(t), wall))
                ids = job_ids(samples)
                assert len(ids) <= 1, ids
                for job_id in ids:
                    seen.setdefault(job_id, set()).add(name)
                idle_reads += not ids
                joules = total(samples, "gpufleet_gpu_energy_joules_total")
                assert joules >= energy[name], f"{name}'s energy counter went back at {t} s"
                energy[name] = joules
        # Two simulated hours of jobs lasting ten minutes on average: several jobs, one after another.
        assert len(seen) >= 6
        assert "424242" in seen and all(job_id.startswith("424242") for job_id in seen)
        sizes = [len(nodes) for nodes in seen.values()]
        assert min(sizes) >= 6 and max(sizes) == 8 and min(sizes) < 8  # Some nodes sit a job out.
        assert idle_reads > 0  # The gaps between jobs.
    finally:
        fleet.close()


async def test_a_restarted_exporter_refuses_scrapes_then_keeps_what_it_counted():
    fleet = Fleet(node_count=2, seed=1)
    fleet.add([Fault("x", "xid", "gpu-node-0001", 5.0, gpu=2, xid=79),
               Fault("r", "exporter_restart", "gpu-node-0001", 40.0, 10.0)])
    fleet.start()
    node = fleet.nodes["gpu-node-0001"]
    wall = _wall().__next__
    try:
        assert total(parse(await node.scrape(0.0, wall)), "gpufleet_gpu_xid_errors_total") == 0
        counted = 0.0
        for attempt in range(100):  # The XID watcher counts the event in its own thread: wait up to 5 s for it.
            counted = total(parse(await node.scrape(20.0 + attempt / 10, wall)), "gpufleet_gpu_xid_errors_total")
            if counted:
                break
            await asyncio.sleep(0.05)
        assert counted == 1
        energy_before = total(parse(await node.scrape(35.0, wall)), "gpufleet_gpu_energy_joules_total")
        clock = {"now": 45.0}
        client = TestClient(TestServer(build_app(fleet, lambda: clock["now"]), host="127.0.0.1"))
        await client.start_server()
        try:
            refused = await client.get("/nodes/gpu-node-0001/metrics")
            other = await client.get("/nodes/gpu-node-0002/metrics")
            assert (refused.status, other.status) == (503, 200)
        finally:
            await client.close()
        after = parse(await node.scrape(60.0, wall))
        # The XID came before the restart: the new process reads its count back from the kept state, and the
        # reboot the GPU needs. The driver's counters go on.
        assert total(after, "gpufleet_gpu_xid_errors_total") == 1
        assert total(after, "gpufleet_gpu_recovery_action") == 3
        assert total(after, "gpufleet_gpu_energy_joules_total") > energy_before
        assert total(after, "gpufleet_gpu_up") == 8
    finally:
        fleet.close()


def test_missed_scrapes_are_the_share_asked_for_and_drawn_from_the_seed():
    missed = missed_scrapes(0.02, seed=7)
    draws = [missed() for _ in range(20_000)]
    assert 0.015 < sum(draws) / len(draws) < 0.025
    again = missed_scrapes(0.02, seed=7)
    assert [again() for _ in range(20_000)] == draws
    assert not any(missed_scrapes(0.0, seed=7)() for _ in range(1000))
