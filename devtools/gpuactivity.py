"""GPM and the GPU's own utilisation, idle and under a load the check makes itself: a bf16 matrix-multiply loop on
every GPU, in PyTorch, in a process of its own so that its import and CUDA context stay out of the check's."""

from __future__ import annotations

import contextlib
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from gpufleet.devtools.gpureport import Options, Report, installed
from gpufleet.devtools.results import Table
from gpufleet.devtools.waiting import HarnessError
from gpufleet.exporter.gpu.gpm import DETAIL, METRICS
from gpufleet.exporter.gpu.nvml import Nvml
from gpufleet.exporter.gpu.session import NvmlSession

# A matrix-multiply loop on every GPU the process sees, in bf16 so that the tensor cores do the work; it says
# "ready" once each GPU has finished one round, and stops after the given seconds or when terminated.
LOAD = """
import sys, time, torch
seconds = float(sys.argv[1])
gpus = range(torch.cuda.device_count())
pairs = [(torch.randn(8192, 8192, device=f"cuda:{g}", dtype=torch.bfloat16),
          torch.randn(8192, 8192, device=f"cuda:{g}", dtype=torch.bfloat16)) for g in gpus]
def round_():
    for a, b in pairs:
        for _ in range(8):
            a @ b
    for g in gpus:
        torch.cuda.synchronize(g)
round_()
print("ready", len(pairs), flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    round_()
"""
# The series that show a load arrive: GPM's activities, and what the GPU reports without GPM.
LOAD_SERIES = ("gpufleet_gpu_tensor_active_ratio", "gpufleet_gpu_graphics_active_ratio", "gpufleet_gpu_sm_active_ratio",
               "gpufleet_gpu_dram_active_ratio", "gpufleet_gpu_utilization_ratio", "gpufleet_gpu_power_watts",
               "gpufleet_gpu_clock_hertz")
_RISE = 0.10  # How much tensor and graphics activity must rise under a bf16 matrix-multiply loop.


def _activity(session: NvmlSession, seconds: float) -> dict[tuple[int, str], float]:
    """The readings of LOAD_SERIES over `seconds`: one sample to open the window, one to close it."""
    session.sample()
    time.sleep(seconds)
    readings: dict[tuple[int, str], float] = {}
    for gpu in session.sample().gpus:
        for reading in gpu.readings:
            if reading.metric.name in LOAD_SERIES and reading.label_values in ((), ("sm",)):
                readings[(gpu.identity.index, reading.metric.name)] = reading.value
            elif reading.metric.name == "gpufleet_gpu_tensor_pipe_active_ratio" and reading.label_values == ("hmma",):
                readings[(gpu.identity.index, "gpufleet_gpu_tensor_pipe_active_ratio{pipe=hmma}")] = reading.value
    return readings


@contextlib.contextmanager
def load(seconds: float) -> Iterator[int]:
    """The matrix-multiply loop on every GPU, once it is running; yields how many GPUs it loads."""
    process = subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 180
            line = ""
            while not line.startswith("ready") and time.monotonic() < deadline and process.poll() is None:
                if selector.select(timeout=1.0):
                    line = process.stdout.readline()
        if not line.startswith("ready"):
            raise HarnessError(f"the load did not start within 180 s: {line or process.poll()}")
        yield int(line.split()[1])
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def activity(nvml: Nvml, options: Options, report: Report, under_load: Callable[[], None]) -> None:
    """GPM and the GPU's own utilisation with the GPUs idle, then under a matrix-multiply loop on each; what else
    should be read under the load is `under_load`."""
    session = NvmlSession(nvml, gpm=METRICS + DETAIL)
    try:
        idle = _activity(session, options.idle_seconds)
        busy: dict[tuple[int, str], float] = {}
        if options.backend == "sim":
            report.skipped.append("load: the simulated GPUs run their own load, not PyTorch's")
        elif not installed("torch"):
            report.skipped.append("load: PyTorch is not installed")
        else:
            with load(options.load_seconds + 60):
                time.sleep(1.0)  # The first collection under load reads from before it began.
                busy = _activity(session, options.load_seconds)
                under_load()
    finally:
        session.close()
    table = Table(["gpu", "series", "idle", "under load"])
    for key in sorted(set(idle) | set(busy)):
        table.add(key[0], key[1], idle.get(key), busy.get(key))
    report.tables["activity, idle and under load"] = table
    gpus = sorted({gpu for gpu, _ in idle})
    for what, series in (("tensor", "gpufleet_gpu_tensor_active_ratio"),
                         ("graphics", "gpufleet_gpu_graphics_active_ratio")):
        report.figures[f"{what} active idle"] = ", ".join(f"{idle.get((g, series), 'none')}" for g in gpus)
        if not busy:
            continue
        report.figures[f"{what} active under load"] = ", ".join(f"{busy.get((g, series), 'none')}" for g in gpus)
        for g in gpus:
            before, after = idle.get((g, series)), busy.get((g, series))
            if before is None or after is None or after < before + _RISE:
                report.failures.append(f"GPU {g}: {what} activity did not rise under the load: {before} -> {after}")
