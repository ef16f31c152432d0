"""The simulated month the reliability report is held against: a fleet failing at the rates of the
shipped Llama 3 profile, its history imported into Prometheus and the rules recorded over it.

The report test runs it at 16 GPUs with every rate multiplied, so that CI sees enough interruptions
for the intervals to mean something; `bench/reliability_bench.py` runs it at 2,048 GPUs at the
profile's own rates.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufleet.alerts import capacity
from gpufleet.alerts import reliability as rules
from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import recorded_by
from gpufleet.devtools.backfill import DAY, backfill, recorded
from gpufleet.devtools.paths import ROOT
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.layout import Job
from gpufleet.simulator.rates import Rate, load_rates

STEP = 300  # As often as Prometheus looks back for an instant: every rule evaluation finds every series.
PROFILE = ROOT / "simulator" / "fault-rates" / "llama3.yml"
METRICS = re.compile(
    r"gpufleet_gpu_(info|up|job_info|xid_errors_total|ecc_errors_total|row_remap_failed|nvlink_up|clock_event_active)"
    r"|gpufleet_infiniband_(state_id|link_downed_total)")
GROUPS = ("gpufleet-reliability", recorded_by(capacity.capacity(Config()))[capacity.JOB_GPUS])
# What the report reads: the reliability group's series, and the capacity rules' GPUs per job. The rest of
# the capacity rules would be a few hundred more blocks for promtool to write and Prometheus to open.
RECORDS = frozenset({rules.GPU_EVENTS, rules.PORT_EVENTS, rules.NODE_EVENTS, rules.OBSERVED, capacity.JOB_GPUS})
PORTS_PER_GPU, NODES_PER_GPU = 1.0, 1 / 8  # The simulated node: 8 GPUs, 8 InfiniBand ports.


def cause_class(rate: Rate) -> str:
    """The report's class for a profile entry, as the profile's header maps it."""
    if rate.xid is not None:
        return next(k for k, codes in (("gpu_memory", rules.MEMORY_XIDS), ("gpu_application", rules.APPLICATION_XIDS),
                                       ("gpu_hardware", rules.HARDWARE_XIDS)) if rate.xid in codes)
    return {"gpu_lost": "gpu_lost", "ecc_dbe": "gpu_memory", "ib_link_down": "network", "exporter_down": "node_down",
            "thermal_slowdown": "thermal"}[rate.kind]


def scaled_rates(scale: float) -> list[Rate]:
    return [dataclasses.replace(r, per_day=r.per_day * scale) for r in load_rates(PROFILE.read_text())]


def asked_per_gpu_day(scale: float) -> dict[str, float]:
    """What the scaled profile asks for, per class, in interruptions per GPU-day."""
    asked = dict.fromkeys(rules.CLASSES, 0.0)
    for rate in scaled_rates(scale):
        per_gpu = {"gpu": 1.0, "port": PORTS_PER_GPU, "node": NODES_PER_GPU}[rate.per]
        asked[cause_class(rate)] += rate.per_day * per_gpu
    return asked


@dataclasses.dataclass(frozen=True)
class Month:
    url: str  # The Prometheus holding it.
    end: float  # The last instant of the 30 recorded days.
    started: Counter[str]  # Faults the simulator started in them, by class.
    timings: dict[str, float]  # Seconds spent writing the history and recording the rules.
    collections: int  # Node collections the history made (the rest were held).


@contextmanager
def month(tmp: Path, fleet: Fleet, days: int, scale: float, seed: int, hold: float = 0.0) -> Iterator[Month]:
    """Prometheus with `days` + 1 days of the fleet's raw history, and the rules recorded over the last
    `days` of them (the first day fills the rules' windows, as a month of a running fleet would)."""
    end = math.floor(time.time() / STEP) * STEP - STEP
    start = end - (days + 1) * DAY
    rates = scaled_rates(scale)
    faults = fleet.draw_faults(rates, (days + 1) * DAY, seed)
    fleet.add(faults)
    classes: dict[tuple[str, int | None, float | None], str] = {
        (r.kind, r.xid, r.duration): cause_class(r) for r in rates}
    started = Counter(classes[(f.kind, f.xid, f.duration)] for f in faults if f.start >= DAY)
    began = time.monotonic()
    data, collections = backfill(tmp, fleet, start, end, STEP, METRICS, hold)
    written = time.monotonic()
    with recorded(tmp, data, end - days * DAY, end, GROUPS, RECORDS) as url:
        timings = {"history": written - began, "rules": time.monotonic() - written}
        yield Month(url, end, started, timings, collections)


def jobs(nodes: int, size: int) -> list[Job]:
    """Jobs of `size` nodes each, side by side, for the whole month."""
    names = [f"gpu-node-{n:04d}" for n in range(1, nodes + 1)]
    return [Job(str(777 + i), "slurm", tuple(names[i * size:(i + 1) * size])) for i in range(math.ceil(nodes / size))]
