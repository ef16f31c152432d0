"""What the exporter costs a GPU node's CPU, projected without a GPU: the NVML calls a collection makes, counted
over the simulated library, priced at what each cost a real GPU in the collector's own order
(`bench/gpu_check.py` records it), plus what the process spends outside NVML, measured here.

The calls are counted on a simulated board made to answer as the measured one did (the calls its driver
refused, its NVLinks), so the counts are those the real board gets. A call no GPU has timed yet is priced at
the cost of a measured one, named in `STAND_INS` with the reason, until a GPU times it: the projection says
which calls those were.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpufleet.devtools.nvmlcalls import Collections, collect
from gpufleet.exporter import node
from gpufleet.exporter.collector.gpu import slow_every
from gpufleet.exporter.gpu.gpm import METRICS
from gpufleet.exporter.gpu.simulated.board import SimulatedGpu
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml

ORDERED_TABLE = "NVML calls in the collector's order"
ORDERED_COLUMNS = ["call", "tier", "calls per GPU and collection", "CPU mean (µs)"]
# Calls no GPU has timed, the measured call each is priced at meanwhile, and why that one. The H200 checked so
# far has no NVLinks; its cheapest link query is the PCIe link width, an RM control answered from the driver's
# own state, which is what the NVLink state and error counter queries are too.
STAND_INS: dict[str, tuple[str, str]] = {
    "nvmlDeviceGetNvLinkState": ("nvmlDeviceGetCurrPcieLinkWidth", "a link query, not timed on a board with NVLinks"),
    "nvmlDeviceGetNvLinkErrorCounter": ("nvmlDeviceGetCurrPcieLinkWidth",
                                        "a link query, not timed on a board with NVLinks"),
}
_FIELDS = re.compile(r"nvmlDeviceGetFieldValues\((?P<ids>[0-9,]*)\)")


@dataclass(frozen=True)
class Costs:
    """Seconds of CPU per call, per tier, as a GPU measured them in the collector's order."""

    per_call: Mapping[str, Mapping[str, float]]  # Tier to call to seconds.
    source: str  # Which record: the board, driver, commit and date.

    @classmethod
    def from_record(cls, run: Mapping[str, Any]) -> Costs:
        table = run.get("tables", {}).get(ORDERED_TABLE)
        if table is None:
            raise LookupError(f"the record of {run.get('date')} has no table {ORDERED_TABLE!r}: rerun "
                              "bench/gpu_check.py on a GPU")
        columns = table["columns"]
        per_call: dict[str, dict[str, float]] = {}
        for row in table["rows"]:
            cells = dict(zip(columns, row, strict=True))
            per_call.setdefault(str(cells["tier"]), {})[str(cells["call"])] = float(cells["CPU mean (µs)"]) / 1e6
        figures = run.get("figures", {})
        return cls(per_call, f"{figures.get('board', '?')}, driver {figures.get('driver_version', '?')}, "
                             f"commit {run.get('commit', '?')}, {run.get('date', '?')}")

    @classmethod
    def measured(cls, counted: Collections, source: str) -> Costs:
        """The costs of the calls as `counted` timed them: the simulated library's own, for what it adds."""
        return cls({tier: counted.call_cpu(tier) for tier in counted.rounds}, source)

    def price(self, tier: str, call: str) -> tuple[float, str]:
        """Seconds of CPU for one call in a collection of `tier`, and the measured call it was priced at where it
        was not measured itself."""
        for measured in (self.per_call.get(tier, {}), *self.per_call.values()):
            if call in measured:
                return measured[call], ""
        name = call.split("(")[0]
        if name in STAND_INS:
            stand_in = STAND_INS[name][0]
            return self.price(tier, stand_in)[0], stand_in
        fields = _FIELDS.fullmatch(call)
        if fields:
            return self._nearest_fields(tier, set(fields["ids"].split(",")))
        raise LookupError(f"{call} was not timed on a GPU and has no stand-in in costmodel.STAND_INS")

    def _nearest_fields(self, tier: str, wanted: set[str]) -> tuple[float, str]:
        """A field-value request not timed as it is, priced as the timed request of the tier sharing the most
        field ids with it: the extra ids the board answers from its own counters cost microseconds each."""
        timed = [(len(wanted & set(m["ids"].split(","))), call, cost)
                 for call, cost in self.per_call.get(tier, {}).items() if (m := _FIELDS.fullmatch(call))]
        if not timed:
            raise LookupError(f"no field-value request was timed in {tier} collections")
        _, call, cost = max(timed)
        return cost, call


@dataclass(frozen=True)
class Line:
    tier: str
    call: str
    calls: float  # Per GPU and collection of the tier.
    seconds: float  # CPU per call.
    stand_in: str  # The measured call it is priced at, or "".


@dataclass(frozen=True)
class Projection:
    """One node's exporter CPU as a share of one core: its NVML calls, and the rest of the process."""

    gpus: int
    nvml: float
    outside: float  # Everything but the NVML calls: the collectors' own work, the scrapes, the event loop.
    lines: list[Line] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.nvml + self.outside


def board_like(record: Mapping[str, Any], count: int) -> list[SimulatedGpu]:
    """`count` simulated boards that refuse what the recorded board refused and have its NVLinks."""
    names = {str(row[3]) for row in record.get("tables", {}).get("refused by the driver", {}).get("rows", [])}
    links = int(record.get("figures", {}).get("GPU 0 NVLinks", 18))
    gpus = simulated_gpus(count)
    for gpu in gpus:
        gpu.unsupported |= {name for name in names if name.startswith(("nvml", "field:", "gpm:"))}
        gpu.gpm_supported = "gpm_supported = False" not in names
        gpu.nvlinks = links
        if links == 0:
            gpu.fabric_state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    return gpus


def count_calls(gpus: list[SimulatedGpu], slow_every: int, rounds: int = 4) -> Collections:
    """The calls the collector makes of these simulated boards at `slow_every`, five seconds apart."""
    now = [1000.0]

    def advance() -> None:
        now[0] += 5.0

    return collect(SimulatedNvml(gpus, clock=lambda: now[0]), rounds=rounds, slow_every=slow_every, gpm=METRICS,
                   advance=advance)


def nvml_share(counted: Collections, costs: Costs, *, gpus: int, interval: float,
               slow_every: int) -> tuple[float, list[Line]]:
    """The share of a core the counted calls take at their costs, for `gpus` GPUs collected every `interval`
    seconds with the slow reads at every `slow_every` collections; and each call's line."""
    weight = {"slow": 1 / slow_every, "fast": (slow_every - 1) / slow_every}
    lines: list[Line] = []
    seconds_per_collection = 0.0
    for tier in counted.rounds:
        for call, calls in counted.counts(tier).items():
            seconds, stand_in = costs.price(tier, call)
            lines.append(Line(tier, call, calls, seconds, stand_in))
            seconds_per_collection += weight[tier] * calls * seconds
    return seconds_per_collection * gpus / interval, lines


def project(like: Collections, costs: Costs, simulated: Collections, *, exporter_share: float, gpus: int,
            interval: float, slow_every: int) -> Projection:
    """A node of `gpus` boards that make the calls counted in `like`, at `costs`; the rest of the process is the
    exporter's CPU over the simulated library (`exporter_share`, measured with as many simulated GPUs, whose
    calls `simulated` counted) less what that library's own calls took."""
    library, _ = nvml_share(simulated, Costs.measured(simulated, "the simulated library"), gpus=gpus,
                            interval=interval, slow_every=slow_every)
    nvml, lines = nvml_share(like, costs, gpus=gpus, interval=interval, slow_every=slow_every)
    return Projection(gpus, nvml, max(0.0, exporter_share - library), lines)


def calls_text() -> str:
    """The NVML calls of one GPU collection at the default flags over `--gpu.backend=sim`'s boards, per GPU, by
    tier: committed as tests/fixtures/nvml-calls.txt, so a change that adds a call shows in review."""
    defaults = node.defaults()
    every = slow_every(defaults)
    counted = count_calls(simulated_gpus(8), every)
    lines = [f"# NVML calls per GPU and collection at the default flags: a GPU collection every "
             f"{defaults.collector_gpu_interval:g} s, the slow reads at one in {every} ({counted.gpus} simulated "
             "H100s).",
             "# Generated by `python -m gpufleet.devtools generate`; bench/exporter_cost.py prices them."]
    for tier in counted.rounds:
        lines += [f"{tier} {call} {calls:g}" for call, calls in counted.counts(tier).items()]
    return "\n".join(lines) + "\n"
