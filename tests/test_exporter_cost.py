"""What the exporter's NVML calls cost: the calls a collection makes, guarded, and the model that prices them.

The calls of one collection at the default flags are committed as tests/fixtures/nvml-calls.txt: a change that
adds a call fails here until the file is regenerated (`.venv/bin/python -m gpufleet.devtools generate`) and
the new call is seen in review. bench/exporter_cost.py projects a node's CPU from them.
"""

from __future__ import annotations

import pytest

from gpufleet.devtools.costmodel import (
    ORDERED_COLUMNS,
    ORDERED_TABLE,
    Costs,
    board_like,
    calls_text,
    count_calls,
    nvml_share,
)
from gpufleet.devtools.nvmlcalls import CallLog
from gpufleet.devtools.paths import FIXTURES
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.gpm import METRICS
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml

from helpers import rendered


def test_a_collection_makes_the_committed_nvml_calls() -> None:
    assert calls_text() == (FIXTURES / "nvml-calls.txt").read_text(), (
        "the NVML calls of a GPU collection changed; if that is meant, run `.venv/bin/python -m gpufleet.devtools "
        "generate`, commit tests/fixtures/nvml-calls.txt, and rerun bench/exporter_cost.py")


def test_utilisation_is_gpm_graphics_activity_where_the_board_has_gpm_and_the_driver_samples_where_not() -> None:
    now = [1000.0]
    boards = simulated_gpus(2)
    boards[1].gpm_supported = False
    log = CallLog(SimulatedNvml(boards, clock=lambda: now[0]))
    collector = GpuCollector(NvmlSession(log, clock=lambda: now[0], gpm=METRICS))
    collector.collect()  # Opens both, and takes GPM's first sample.
    log.tier = "counted"
    for _ in range(3):
        now[0] += 5.0
        samples = rendered(collector.collect())
    gpm_board = {key: value for key, value in samples.items() if ("gpu", "0") in key[1]}
    utilization = next(v for (name, _), v in gpm_board.items() if name == "gpufleet_gpu_utilization_ratio")
    graphics = next(v for (name, _), v in gpm_board.items() if name == "gpufleet_gpu_graphics_active_ratio")
    assert utilization == graphics
    assert 0 < utilization <= 1
    # Only the board without GPM asks the driver for its samples, once a collection.
    assert log.tallies["counted"]["nvmlDeviceGetSamples"].calls == 3
    assert any(name == "gpufleet_gpu_utilization_ratio" and ("gpu", "1") in labels for name, labels in samples)


def _record(rows: list[list[object]], links: int = 0) -> dict:
    return {"figures": {"board": "NVIDIA H200", "GPU 0 NVLinks": links},
            "tables": {"refused by the driver": {"columns": [], "rows": [[0, "field 160", "x", "field:160"]]},
                       ORDERED_TABLE: {"columns": ORDERED_COLUMNS, "rows": rows}}}


def test_the_model_prices_each_call_as_timed_in_the_collectors_order_and_names_its_stand_ins() -> None:
    counted = count_calls(board_like(_record([]), 2))
    rows = [[call, tier, calls, 10.0] for tier in counted.rounds for call, calls in counted.counts(tier).items()]
    rows = [row if row[0] != "nvmlGpmSampleGet" else [*row[:3], 1000.0] for row in rows]
    costs = Costs.from_record(_record(rows))
    share, lines = nvml_share(counted, costs, gpus=8, interval=5.0)
    per_collection = sum(counted.share(t) * sum(counted.counts(t).values()) * 10e-6 for t in counted.rounds)
    assert share == pytest.approx((per_collection + 990e-6) * 8 / 5.0)
    assert not any(line.stand_in for line in lines)
    # A board with NVLinks makes link calls no GPU has timed: priced at the stand-in, and said so.
    linked = count_calls(board_like(_record([], links=18), 1))
    _, lines = nvml_share(linked, costs, gpus=8, interval=5.0)
    stand_ins = {line.call: line.stand_in for line in lines if line.stand_in}
    assert stand_ins["nvmlDeviceGetNvLinkErrorCounter"] == "nvmlDeviceGetCurrPcieLinkWidth"
    assert any(call.startswith("nvmlDeviceGetFieldValues(") for call in stand_ins)
    with pytest.raises(LookupError, match="nvmlDeviceGetMemoryInfo"):
        Costs.from_record(_record([row for row in rows if row[0] != "nvmlDeviceGetMemoryInfo"])).price(
            "fast", "nvmlDeviceGetMemoryInfo")
