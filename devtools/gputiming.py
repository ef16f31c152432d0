"""What a GPU collection costs, timed on the GPUs the check runs on: the collection as the exporter makes it, with
and without its slow reads, each NVML call where the collector makes it (what the cost model prices calls at),
each call and field alone, the cheaper calls that could replace the dearest, and `nvidia-smi --query-gpu` on the
same GPUs."""

from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpufleet.devtools import smi
from gpufleet.devtools.costmodel import (
    ORDERED_COLUMNS,
    ORDERED_TABLE,
    Costs,
    board_like,
    collector_share,
    count_calls,
    project,
)
from gpufleet.devtools.gpureport import Options, Report, initialised
from gpufleet.devtools.nvmlcalls import collect
from gpufleet.devtools.results import Table
from gpufleet.devtools.stats import percentile
from gpufleet.exporter import node
from gpufleet.exporter.collector.gpu import counter_every, slow_every
from gpufleet.exporter.gpu.gpm import METRICS, GpmReader
from gpufleet.exporter.gpu.nvml import Nvml
from gpufleet.exporter.gpu.probes import FIELDS, PROBES, read_fields
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.utilization import utilization_probe


@dataclass
class Durations:
    """Wall-clock and CPU seconds of each call: NVML waits on the driver, and only the CPU counts against the
    exporter's budget."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def __iadd__(self, other: Durations) -> Durations:
        self.wall += other.wall
        self.cpu += other.cpu
        return self


def _timed(call: Callable[[], object], times: int) -> Durations:
    durations = Durations()
    for _ in range(times):
        wall, cpu = time.perf_counter(), time.thread_time()
        call()
        durations.cpu.append(time.thread_time() - cpu)
        durations.wall.append(time.perf_counter() - wall)
    return durations


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _time_calls(nvml: Nvml, index: int, handle: Any, times: int, calls: dict[str, Durations]) -> None:
    """Each NVML call of a collection on one GPU, `times` times, and each field alone; a call the GPU refuses is
    left out."""
    for probe in (utilization_probe(), *PROBES):
        try:
            probe.read(nvml, handle)
        except pynvml.NVMLError:
            continue  # Refused: listed by `refusals`.
        calls[probe.name] += _timed(functools.partial(probe.read, nvml, handle), times)
    calls["nvmlDeviceGetFieldValues (all fields)"] += _timed(
        lambda: list(read_fields(nvml, handle, FIELDS)), times)
    for fld in FIELDS:
        calls[f"field {fld.field_id} ({fld.description}) alone"] += _timed(
            functools.partial(nvml.nvmlDeviceGetFieldValues, handle, [fld.field_id]), times)
    calls["nvmlDeviceGetUtilizationRates alone"] += _timed(
        functools.partial(nvml.nvmlDeviceGetUtilizationRates, handle), times)
    with contextlib.suppress(pynvml.NVMLError):
        calls["nvmlDeviceGetSamples (GPU utilisation) alone"] += _timed(functools.partial(
            nvml.nvmlDeviceGetSamples, handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0), times)
    _time_alternatives(nvml, handle, times, calls)
    with contextlib.suppress(pynvml.NVMLError):
        nvml.nvmlDeviceGetMigMode(handle)
        calls["nvmlDeviceGetMigMode"] += _timed(functools.partial(nvml.nvmlDeviceGetMigMode, handle), times)
    with contextlib.suppress(pynvml.NVMLError):
        nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        calls["nvmlDeviceGetComputeRunningProcesses"] += _timed(
            functools.partial(nvml.nvmlDeviceGetComputeRunningProcesses, handle), times)
    reader = GpmReader(index, METRICS)
    try:
        if nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            calls["GPM (sample and metrics)"] += _timed(functools.partial(reader.read, nvml, handle), times)
    except pynvml.NVMLError:
        pass  # Refused: listed by `refusals`.
    finally:
        reader.free(nvml)


def _time_alternatives(nvml: Any, handle: Any, times: int, calls: dict[str, Durations]) -> None:
    """Calls the exporter does not make but could, for what its dearest calls read: the energy counter through
    its own function, only the last second's utilisation samples, and the power reading energy could be integrated
    from. Only where the library has them (the simulated one does not)."""
    now_us = int(time.time() * 1e6)
    for name, arguments in (("nvmlDeviceGetTotalEnergyConsumption", (handle,)),
                            ("nvmlDeviceGetSamples", (handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, now_us - 1_000_000)),
                            ("nvmlDeviceGetPowerUsage", (handle,))):
        call = getattr(nvml, name, None)
        if call is None or isinstance(nvml, SimulatedNvml):
            continue
        label = f"{name} (alternative)" if name != "nvmlDeviceGetSamples" else "nvmlDeviceGetSamples (last second)"
        with contextlib.suppress(pynvml.NVMLError):
            call(*arguments)
            calls[label] += _timed(functools.partial(call, *arguments), times)


def timing(nvml: Nvml, options: Options, report: Report) -> None:
    """The GPU collection as the exporter runs it, each NVML call it makes, and nvidia-smi on the same GPUs."""
    f = report.figures
    defaults = node.defaults()
    counted = collect(nvml, rounds=max(1, options.rounds // counter_every(defaults)), slow_every=slow_every(defaults),
                      counter_every=counter_every(defaults), gpm=METRICS)
    dearest = [1000 * d for d in counted.wall["counter"]]
    f["GPU collection rounds"] = sum(counted.rounds.values())
    f["GPU collection mean (ms)"] = round(_mean(dearest), 2)
    f["GPU collection p99 (ms)"] = round(percentile(dearest, 0.99), 2)
    f["GPU collection CPU mean (ms)"] = round(1000 * counted.cpu["counter"], 2)
    f["GPU collection CPU without the slow reads (ms)"] = round(1000 * counted.cpu["fast"], 2)
    # At the default flags, per GPU and for an 8-GPU node, as a share of one core: the exporter's budget is 1 % for
    # everything.
    per_collection = sum(counted.share(tier) * counted.cpu[tier] for tier in counted.rounds)
    per_gpu = per_collection / defaults.collector_gpu_interval / counted.gpus
    f["GPU collection CPU at default flags, per GPU (share of a core)"] = round(per_gpu, 5)
    f["GPU collection CPU at default flags, 8 GPUs (share of a core)"] = round(8 * per_gpu, 4)
    ordered = Table(ORDERED_COLUMNS)
    for tier in counted.rounds:
        cpu = counted.call_cpu(tier)
        for call, made in counted.counts(tier).items():
            ordered.add(call, tier, round(made, 3), round(1e6 * cpu[call], 1))
    report.tables[ORDERED_TABLE] = ordered
    calls: dict[str, Durations] = defaultdict(Durations)
    with initialised(nvml) as handles:
        for index, handle in enumerate(handles):
            _time_calls(nvml, index, handle, options.calls, calls)
    table = Table(["call", "calls", "mean (µs)", "p99 (µs)", "CPU mean (µs)"])  # Each alone, in a loop.
    for name, durations in calls.items():
        micros = [1e6 * d for d in durations.wall]
        table.add(name, len(micros), round(_mean(micros), 1), round(percentile(micros, 0.99), 1),
                  round(1e6 * _mean(durations.cpu), 1))
    report.tables["NVML calls"] = table
    if options.nvidia_smi is None:
        report.skipped.append("nvidia-smi timing: nvidia-smi is not installed")
        return
    query = [options.nvidia_smi, f"--query-gpu={','.join(smi.FIELDS)}", "--format=csv,noheader,nounits"]
    runs = [1000 * d for d in _timed(lambda: subprocess.run(query, capture_output=True, timeout=60),
                                     options.smi_rounds).wall]
    f["nvidia-smi query mean (ms)"] = round(_mean(runs), 1)
    f["nvidia-smi query max (ms)"] = round(max(runs), 1)


def cost_model(report: Report) -> None:
    """The cost model's projection for this machine's GPUs at the default flags beside the exporter measured at
    them: the calls counted over simulated boards made to answer as these do, priced at what `timing` measured,
    plus the GPU collector's work around them and the exporter without its GPU collector, both measured here. A
    node no GPU machine has is projected the same way, so the model is worth what this agreement is."""
    f = report.figures
    record = {"figures": f, "tables": {title: {"columns": t.columns, "rows": t.rows}
                                       for title, t in report.tables.items()}}
    defaults = node.defaults()
    gpus = int(report.number("gpus"))
    like = count_calls(board_like(record, gpus))
    projection = project(like, Costs.from_record(record), collector=collector_share(board_like(record, gpus)),
                         rest=report.number("exporter CPU without the GPU collector (share of a core)"), gpus=gpus,
                         interval=defaults.collector_gpu_interval)
    f["model: projected exporter CPU at default flags (share of a core)"] = round(projection.total, 4)
    f["model: projected NVML calls (share of a core)"] = round(projection.nvml, 4)
    f["model: measured / projected CPU"] = round(
        report.number("exporter CPU at default flags (share of a core)") / projection.total, 2)
    peak = report.number("exporter peak RSS over the simulated library (MiB)") + sum(
        report.number(f"NVML loaded and opened: {part} (MiB)", 0.0) for part in ("heap", "mapped files"))
    f["model: projected peak RSS at default flags (MiB)"] = round(peak, 1)
    measured_peak = report.number("exporter peak RSS at default flags (MiB)")
    f["model: measured / projected peak RSS"] = round(measured_peak / peak, 2)
    real = {(str(row[1]), str(row[0])): float(str(row[2])) for row in report.tables[ORDERED_TABLE].rows}
    simulated = {(tier, call): made for tier in like.rounds for call, made in like.counts(tier).items()}
    differing = [f"{tier} {call}: simulated {simulated.get((tier, call), 0):g}, here {real.get((tier, call), 0):g}"
                 for tier, call in sorted(real.keys() | simulated.keys())
                 if abs(simulated.get((tier, call), 0) - real.get((tier, call), 0)) > 0.01]
    f["model: calls counted differently over the simulated boards"] = "; ".join(differing) or "none"
