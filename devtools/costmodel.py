"""What the exporter costs a GPU node's CPU, projected without a GPU: the NVML calls a collection makes, counted
over the simulated library, priced at what each cost a real GPU in the collector's own order
(`bench/gpu_check.py` records it); plus the GPU collector's own work around the calls, measured here over the
same simulated boards; plus the rest of the process (the other collectors, the scrapes, the event loop),
measured as the exporter without its GPU collector.

The calls are counted on simulated boards made to answer as the measured one did (the calls its driver refused,
its NVLinks), so the counts, and the collector's work on their answers, are those the real board gets. A call
no GPU has timed yet is priced at the cost of a measured one, named in `STAND_INS` with the reason, until a GPU
times it: the projection says which calls those were.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpufleet.devtools.nvmlcalls import TIERS, CallLog, Collections, collect
from gpufleet.exporter import node
from gpufleet.exporter.collector.gpu import counter_every, slow_every
from gpufleet.exporter.gpu.gpm import METRICS
from gpufleet.exporter.gpu.probes import VIOLATION_POLICIES
from gpufleet.exporter.gpu.simulated.board import SimulatedGpu
from gpufleet.exporter.gpu.simulated.host import simulated_gpus, simulated_procfs
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml

ORDERED_TABLE = "NVML calls in the collector's order"
ALONE_TABLE = "NVML calls"
ORDERED_COLUMNS = ["call", "tier", "calls per GPU and collection", "CPU mean (µs)"]
# Calls no GPU has timed, and the measured call each is priced at meanwhile.
STAND_INS: dict[str, str] = {
    # The H200 checked so far has no NVLinks. Its PCIe link width is a link query answered from the driver's own
    # state, as the NVLink state and error counter queries are.
    "nvmlDeviceGetNvLinkState": "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetNvLinkErrorCounter": "nvmlDeviceGetCurrPcieLinkWidth",
    # Nor an NVSwitch fabric, so the registration query was refused at start and never timed: priced as one of
    # the board's dear queries rather than a cheap one, so that the projection errs high.
    "nvmlDeviceGetGpuFabricInfoV": "nvmlDeviceGetMarginTemperature",
}
_FIELDS = re.compile(r"nvmlDeviceGetFieldValues\((?P<ids>[0-9,]*)\)")


def _alone_key(row: str) -> str | None:
    """The call a row of gpu_check's table of calls timed alone stands for, or None where it is none the
    collector makes every collection (a board constant, an alternative, every field at once)."""
    name = row.removesuffix(" alone").replace(" (GPU utilisation)", "")
    if name == "GPM (sample and metrics)":
        return "nvmlGpmSampleGet"  # Sample and metrics timed as one; the metrics call is priced inside it.
    chosen = re.fullmatch(r"(nvmlDeviceGet(?:ClockInfo|ViolationStatus))\((\w+)\)", name)
    if chosen:
        function, argument = chosen.groups()
        code = _CLOCKS.get(argument) if function == "nvmlDeviceGetClockInfo" else _POLICIES.get(argument)
        return None if code is None else f"{function}({code})"
    return name if re.fullmatch(r"nvml\w+", name) else None


_CLOCKS = {"SM": pynvml.NVML_CLOCK_SM, "MEM": pynvml.NVML_CLOCK_MEM}
_POLICIES = dict(VIOLATION_POLICIES)
_FIELD_ALONE = re.compile(r"field (?P<id>[0-9]+) \(.*\) alone")


@dataclass(frozen=True)
class Costs:
    """Seconds of CPU per call, per tier, as a GPU measured them: in the collector's order where the record has
    that table, else each call timed alone in a loop (the first H200 records), and then each field alone too."""

    per_call: Mapping[str, Mapping[str, float]]  # Tier to call to seconds.
    source: str  # Which record: the board, driver, commit and date, and how the calls were timed.
    per_field: Mapping[str, float] = field(default_factory=dict)  # Field id to seconds, timed alone.

    @classmethod
    def from_record(cls, run: Mapping[str, Any]) -> Costs:
        tables, figures = run.get("tables", {}), run.get("figures", {})
        where = (f"{figures.get('board', '?')}, driver {figures.get('driver_version', '?')}, commit "
                 f"{run.get('commit', '?')}, {run.get('date', '?')}")
        if ORDERED_TABLE in tables:
            per_call: dict[str, dict[str, float]] = {}
            for cells in _rows(tables[ORDERED_TABLE]):
                per_call.setdefault(str(cells["tier"]), {})[str(cells["call"])] = float(cells["CPU mean (µs)"]) / 1e6
            return cls(per_call, f"{where}, in the collector's order")
        if ALONE_TABLE not in tables:
            raise LookupError(f"the record of {run.get('date')} has no table of NVML calls: rerun bench/gpu_check.py "
                              "on a GPU")
        alone: dict[str, float] = {}
        fields: dict[str, float] = {}
        for cells in sorted(_rows(tables[ALONE_TABLE]), key=lambda c: str(c["call"]).endswith(" alone")):
            row, seconds = str(cells["call"]), float(cells["CPU mean (µs)"]) / 1e6
            if found := _FIELD_ALONE.fullmatch(row):
                fields[found["id"]] = seconds
            elif key := _alone_key(row):
                alone[key] = seconds  # A call timed alone outranks the probe that makes it with others.
        alone["nvmlGpmMetricsGet"] = 0.0
        return cls(dict.fromkeys(TIERS, alone), f"{where}, each call alone", fields)

    def price(self, tier: str, call: str) -> tuple[float, str]:
        """Seconds of CPU for one call in a collection of `tier`, and the measured call it was priced at where it
        was not measured itself."""
        for measured in (self.per_call.get(tier, {}), *self.per_call.values()):
            if call in measured:
                return measured[call], ""
        name = call.split("(")[0]
        if name in STAND_INS:
            return self.price(tier, STAND_INS[name])[0], STAND_INS[name]
        fields = _FIELDS.fullmatch(call)
        if fields and self.per_field:
            return self._field_sum(fields["ids"].split(","))
        if fields:
            return self._nearest_fields(tier, set(fields["ids"].split(",")))
        raise LookupError(f"{call} was not timed on a GPU and has no stand-in in costmodel.STAND_INS")

    def _field_sum(self, ids: list[str]) -> tuple[float, str]:
        """A field-value request priced as its fields timed alone, each a whole call: an upper bound. A field
        not timed is priced at the median field's cost."""
        timed = sorted(self.per_field.values())
        median = timed[len(timed) // 2]
        missing = [i for i in ids if i not in self.per_field]
        cost = sum(self.per_field.get(i, median) for i in ids)
        return cost, f"fields {','.join(missing)} at the median field's cost" if missing else ""

    def _nearest_fields(self, tier: str, wanted: set[str]) -> tuple[float, str]:
        """A field-value request not timed as it is, priced as the timed request of the tier sharing the most
        field ids with it: the extra ids the board answers from its own counters cost microseconds each."""
        timed = [(len(wanted & set(m["ids"].split(","))), call, cost)
                 for call, cost in self.per_call.get(tier, {}).items() if (m := _FIELDS.fullmatch(call))]
        if not timed:
            raise LookupError(f"no field-value request was timed in {tier} collections")
        _, call, cost = max(timed)
        return cost, call


def _rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]


@dataclass(frozen=True)
class Line:
    """One call's part of a projection."""

    tier: str
    call: str
    calls: float  # Per GPU and collection of the tier.
    seconds: float  # CPU per call.
    stand_in: str  # The measured call it is priced at, or "".
    weight: float  # The share of collections that are of the tier.


@dataclass(frozen=True)
class Projection:
    """One node's exporter CPU as a share of one core, in its parts."""

    gpus: int
    nvml: float
    collector: float  # The GPU collector's own work around the calls: families, checks, rendering.
    rest: float  # The rest of the process: the other collectors, the scrapes, the event loop.
    lines: list[Line] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.nvml + self.collector + self.rest


def made_like(record: Mapping[str, Any], boards: list[SimulatedGpu]) -> list[SimulatedGpu]:
    """The boards, made to refuse what the recorded board refused and to have its NVLinks."""
    names = {str(row[3]) for row in record.get("tables", {}).get("refused by the driver", {}).get("rows", [])}
    links = int(record.get("figures", {}).get("GPU 0 NVLinks", 18))
    for board in boards:
        board.unsupported |= {name for name in names if name.startswith(("nvml", "field:", "gpm:"))}
        board.gpm_supported = "gpm_supported = False" not in names
        board.nvlinks = links
        if links == 0:
            board.fabric_state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    return boards


def board_like(record: Mapping[str, Any], count: int) -> list[SimulatedGpu]:
    """`count` simulated boards that answer as the recorded board did."""
    return made_like(record, simulated_gpus(count))


def count_calls(gpus: list[SimulatedGpu], args: argparse.Namespace | None = None, rounds: int = 2) -> Collections:
    """The calls the collector makes of these simulated boards on the schedule of `args` (the defaults)."""
    args = args or node.defaults()
    now = [1000.0]

    def advance() -> None:
        now[0] += args.collector_gpu_interval

    return collect(SimulatedNvml(gpus, clock=lambda: now[0]), rounds=rounds, slow_every=slow_every(args),
                   counter_every=counter_every(args), gpm=METRICS, advance=advance)


def nvml_share(counted: Collections, costs: Costs, *, gpus: int, interval: float) -> tuple[float, list[Line]]:
    """The share of a core the counted calls take at their costs, for `gpus` GPUs collected every `interval`
    seconds on the schedule they were counted on; and each call's line."""
    lines: list[Line] = []
    seconds_per_collection = 0.0
    for tier in counted.rounds:
        for call, calls in counted.counts(tier).items():
            seconds, stand_in = costs.price(tier, call)
            lines.append(Line(tier, call, calls, seconds, stand_in, counted.share(tier)))
            seconds_per_collection += counted.share(tier) * calls * seconds
    return seconds_per_collection * gpus / interval, lines


def collector_share(boards: list[SimulatedGpu], args: argparse.Namespace | None = None, cycles: int = 2) -> float:
    """The share of a core the GPU collector, built as the exporter builds it, spends outside NVML on these
    simulated boards at the schedule of `args` (the defaults): each collection's CPU, less the library's calls.
    The call log's own bookkeeping counts with the collector, so this errs high."""
    args = args or node.defaults("--gpu.backend=sim", f"--sim.gpus={len(boards)}")
    now = [1000.0]
    log = CallLog(SimulatedNvml(boards, clock=lambda: now[0]))
    hardware = dataclasses.replace(node.hardware(args), nvml=log, procfs=simulated_procfs(boards))
    [gpu] = [collector for collector in node.build(args, hardware) if collector.name == "gpu"]
    collections = cycles * math.lcm(slow_every(args), counter_every(args))
    try:
        gpu.start()
        gpu.collect_now()  # Opens the GPUs.
        inside, started = log.cpu(), time.thread_time()
        for _ in range(collections):
            now[0] += args.collector_gpu_interval
            gpu.collect_now()
        outside = time.thread_time() - started - (log.cpu() - inside)
    finally:
        gpu.stop()
        gpu.close()
    interval: float = args.collector_gpu_interval
    return outside / collections / interval


def project(like: Collections, costs: Costs, *, collector: float, rest: float, gpus: int,
            interval: float) -> Projection:
    """A node of `gpus` boards that make the calls counted in `like`, at `costs`; the GPU collector's own work
    (`collector`) and the rest of the process (`rest`) as measured, each a share of a core."""
    nvml, lines = nvml_share(like, costs, gpus=gpus, interval=interval)
    return Projection(gpus, nvml, collector, rest, lines)


def calls_text() -> str:
    """The NVML calls of one GPU collection at the default flags over `--gpu.backend=sim`'s boards, per GPU, by
    tier: committed as tests/fixtures/nvml-calls.txt, so a change that adds a call shows in review."""
    defaults = node.defaults()
    counted = count_calls(simulated_gpus(8), defaults)
    lines = [f"# NVML calls per GPU and collection at the default flags: a GPU collection every "
             f"{defaults.collector_gpu_interval:g} s, the slow reads at one in {slow_every(defaults)}, the counters "
             f"at one in {counter_every(defaults)} ({counted.gpus} simulated H100s).",
             "# Generated by `python -m gpufleet.devtools generate`; bench/exporter_cost.py prices them."]
    for tier in counted.rounds:
        lines += [f"{tier} {call} {calls:g}" for call, calls in counted.counts(tier).items()]
    return "\n".join(lines) + "\n"
