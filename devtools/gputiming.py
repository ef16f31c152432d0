"""What a GPU collection costs, timed on the GPUs the check runs on: the collection as the exporter makes it, with
and without its slow reads, each NVML call it makes (wall-clock and CPU), each field alone, the cheaper calls that
could replace the dearest, and `nvidia-smi --query-gpu` on the same GPUs."""

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
from gpufleet.devtools.gpureport import Options, Report, initialised
from gpufleet.devtools.results import Table
from gpufleet.devtools.stats import percentile
from gpufleet.exporter import node
from gpufleet.exporter.collector.gpu import GpuCollector, slow_every
from gpufleet.exporter.gpu.gpm import METRICS, GpmReader
from gpufleet.exporter.gpu.nvml import Nvml
from gpufleet.exporter.gpu.probes import FIELDS, PROBES, read_fields, utilization_probe
from gpufleet.exporter.gpu.session import NvmlSession
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml


@dataclass
class Durations:
    """Wall-clock and CPU seconds of each call: NVML waits on the driver, and only the CPU counts against the
    exporter's budget."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    gpus: tuple[int, ...] = ()  # The GPUs a collection read, where the calls were collections.

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


def _collections(nvml: Nvml, rounds: int, slow_every: int) -> Durations:
    """`rounds` GPU collections as the exporter makes them, after a first that opens the GPUs; the slow reads at
    every `slow_every` collections (past `rounds`: only in the first)."""
    collector = GpuCollector(NvmlSession(nvml, gpm=METRICS, slow_every=slow_every))
    try:
        first = collector.collect()
        durations = _timed(collector.collect, rounds)
    finally:
        collector.close()
    durations.gpus = tuple(sorted({int(s.labels["gpu"]) for family in first.families for s in family.samples
                                   if family.name == "gpufleet_gpu_up" and s.value == 1}))
    return durations


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
    every, fast = _collections(nvml, options.rounds, 1), _collections(nvml, options.rounds, options.rounds + 1)
    wall = [1000 * d for d in every.wall]
    f["GPU collection rounds"] = options.rounds
    f["GPU collection mean (ms)"] = round(_mean(wall), 2)
    f["GPU collection p99 (ms)"] = round(percentile(wall, 0.99), 2)
    f["GPU collection CPU mean (ms)"] = round(1000 * _mean(every.cpu), 2)
    f["GPU collection CPU without the slow reads (ms)"] = round(1000 * _mean(fast.cpu), 2)
    # At the default flags, per GPU and for an 8-GPU node, as a share of one core: the exporter's budget is 1 % for
    # everything.
    defaults = node.defaults()
    per_collection = _mean(fast.cpu) + (_mean(every.cpu) - _mean(fast.cpu)) / slow_every(defaults)
    per_gpu = per_collection / defaults.collector_gpu_interval / (len(every.gpus) or 1)
    f["GPU collection CPU at default flags, per GPU (share of a core)"] = round(per_gpu, 5)
    f["GPU collection CPU at default flags, 8 GPUs (share of a core)"] = round(8 * per_gpu, 4)
    calls: dict[str, Durations] = defaultdict(Durations)
    with initialised(nvml) as handles:
        for index, handle in enumerate(handles):
            _time_calls(nvml, index, handle, options.calls, calls)
    table = Table(["call", "calls", "mean (µs)", "p99 (µs)", "CPU mean (µs)"])
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
