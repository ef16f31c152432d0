"""A job's synchronous checkpoints in the simulator: what its nodes' GPUs read, through the exporter, while one
is written, and how a layout asks for them.

The rules must page nobody for a checkpoint, so the test fleet must have them: the writer's GPUs idle, and where
the first node writes alone, the others spin in a barrier as a hung job's do.
"""

import asyncio
import itertools

import pytest
import yaml

from gpufleet.devtools.detection import layout
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.layout import Checkpoint, Job, LayoutError, load_layout

from fleets import value
from helpers import parse

NODES = ("gpu-node-0001", "gpu-node-0002")
# Ten steps of 40 s, then a write of 60 s: the first checkpoint runs from 400 s to 460 s.
EVERY, LASTS, PERIOD = 400.0, 60.0, 40.0


def _readings(writers: str, times: tuple[float, ...]) -> list[dict[str, dict]]:
    """Every node of a two-node job with checkpoints, scraped through its exporter at each simulated time in
    turn: each reading holds what the GPUs did since the one before."""
    job = Job("424242", "slurm", NODES, period=PERIOD, comm_fraction=0.3,
              checkpoint=Checkpoint(EVERY, LASTS, writers))
    fleet = Fleet(node_count=3, gpus_per_node=2, seed=7, layout=[job])
    wall = itertools.count(0, 100).__next__  # Each scrape is "100 s later": every collector runs.

    async def scrape_at(t: float) -> dict[str, dict]:
        return {name: parse(await node.scrape(t, wall)) for name, node in fleet.nodes.items()}

    fleet.start()
    try:
        return [asyncio.run(scrape_at(t)) for t in times]
    finally:
        fleet.close()


def _gpus(samples: dict, name: str, **labels: str) -> list[float]:
    return [value(samples, name, gpu=str(gpu), **labels) for gpu in range(2)]


def test_the_first_node_writes_alone_while_the_others_spin_in_a_barrier():
    """Between two scrapes inside the write, the writer's GPUs are idle and clocked down; its peer's are busy to
    NVML while their SMs and tensor pipes stand still. Before it and after it, both train alike."""
    training, writing, again = _readings("first", (370.0, 395.0, 410.0, 450.0, 470.0, 500.0))[1::2]
    for reading in (training, again):
        for node in NODES:
            assert min(_gpus(reading[node], "gpufleet_gpu_utilization_ratio")) > 0.8, node
            assert min(_gpus(reading[node], "gpufleet_gpu_sm_active_ratio")) > 0.3, node
    writer, waiting = writing["gpu-node-0001"], writing["gpu-node-0002"]
    assert max(_gpus(writer, "gpufleet_gpu_utilization_ratio")) == 0.0
    clock = {"name": "gpufleet_gpu_clock_hertz", "clock": "sm"}
    assert max(_gpus(writer, **clock)) < 0.5 * min(_gpus(training["gpu-node-0001"], **clock))
    assert min(_gpus(waiting, "gpufleet_gpu_utilization_ratio")) > 0.8
    assert max(_gpus(waiting, "gpufleet_gpu_sm_active_ratio")) < 0.1
    assert max(_gpus(waiting, "gpufleet_gpu_tensor_active_ratio")) < 0.05
    # The node outside the job idles throughout.
    assert max(_gpus(writing["gpu-node-0003"], "gpufleet_gpu_utilization_ratio")) == 0.0


def test_where_every_rank_writes_its_shard_every_node_idles_together():
    _, writing = _readings("all", (410.0, 450.0))
    for node in NODES:
        assert max(_gpus(writing[node], "gpufleet_gpu_utilization_ratio")) == 0.0, node
        assert max(_gpus(writing[node], "gpufleet_gpu_sm_active_ratio")) == 0.0, node


def test_the_nodes_of_a_job_that_churn_started_write_together_however_late_each_noticed_it():
    """A job that follows another on a slot starts at one moment, and its steps count from it on every node: a
    node first collected 20 s after its peer writes the same checkpoint at the same time, as a job that
    synchronises every step does, and does not idle while its peer trains."""
    first = Job("424242", "slurm", NODES, period=PERIOD, checkpoint=Checkpoint(EVERY, LASTS, "all"))
    fleet = Fleet(node_count=2, gpus_per_node=2, seed=7, layout=[first], job_lifetime=2000.0)
    job = next(job for t in range(0, 10_000, 10) for job in fleet.jobs_at(float(t)) if job.id != first.id)
    assert job.started > 0.0 and set(job.nodes) == set(NODES)
    write = job.started + round(EVERY / job.period) * job.period
    wall = itertools.count(0, 100).__next__

    async def scrape(node: str, t: float) -> dict:
        return parse(await fleet.nodes[node].scrape(t, wall))

    fleet.start()
    try:
        for node, delay in zip(NODES, (5.0, 25.0), strict=True):
            joined = asyncio.run(scrape(node, job.started + delay))
            assert value(joined, "gpufleet_gpu_job_info", gpu="0", job_id=job.id) == 1, node
        for node in NODES:
            asyncio.run(scrape(node, write + 5.0))
        inside = {node: asyncio.run(scrape(node, write + LASTS - 5.0)) for node in NODES}
    finally:
        fleet.close()
    for node in NODES:
        assert max(_gpus(inside[node], "gpufleet_gpu_utilization_ratio")) == 0.0, node


def test_a_layout_asks_for_checkpoints():
    layout = load_layout("jobs:\n"
                         "  - {id: '77', scheduler: slurm, nodes: [gpu-node-0001],"
                         " checkpoint: {every: 30m, lasts: 90s, writers: first}}\n"
                         "  - {id: '78', scheduler: slurm, nodes: [gpu-node-0002],"
                         " checkpoint: {every: 1h, lasts: 2m}}\n"
                         "  - {id: '79', scheduler: slurm, nodes: [gpu-node-0003]}\n", (*NODES, "gpu-node-0003"))
    assert [job.checkpoint for job in layout] == [Checkpoint(1800.0, 90.0, "first"), Checkpoint(3600.0, 120.0, "all"),
                                                  None]


@pytest.mark.parametrize(("checkpoint", "message"), [
    ("30m", "job 1: checkpoint: expected a mapping of every, lasts and writers, not str"),
    ("{every: 30m}", "job 1: checkpoint: lasts is required"),
    ("{every: soon, lasts: 1m}", "job 1: checkpoint: every: invalid duration 'soon'"),
    ("{every: 30m, lasts: 0s}", "job 1: checkpoint: lasts must be longer than zero"),
    ("{every: 30m, lasts: 1m, writers: rank0}", "job 1: checkpoint: writers must be one of all, first, not 'rank0'"),
    ("{every: 30m, lasts: 1m, async: true}", "job 1: checkpoint: unknown field 'async'"),
])
def test_checkpoints_in_a_layout_are_checked_with_clear_messages(checkpoint, message):
    with pytest.raises(LayoutError, match=message):
        load_layout(f"jobs: [{{id: '1', scheduler: slurm, nodes: [gpu-node-0001], checkpoint: {checkpoint}}}]",
                    NODES)


def test_the_benches_jobs_with_checkpoints_are_a_layout_the_simulator_runs():
    """The detection bench and the on-call week write their jobs' checkpoints as the simulator reads them: every
    job has its own interval, and writers alternate."""
    nodes, jobs = layout([4, 8, 4], seed=1, checkpoint=(180.0, 6.0))
    loaded = load_layout(yaml.safe_dump({"jobs": jobs}), [f"gpu-node-{i:04d}" for i in range(1, nodes + 1)])
    checkpoints = [job.checkpoint for job in loaded]
    assert [c.writers for c in checkpoints if c] == ["all", "first", "all"]
    assert all(c and c.lasts == 6.0 and 90.0 <= c.every <= 270.0 for c in checkpoints)
    assert len({c.every for c in checkpoints if c}) == 3
