"""The real-GPU check behind `bench/gpu_check.py`: each part of it, run in order, each failure kept and reported.

A GPU machine is lent for a few minutes at a time, with no network and nobody to fix a script halfway: every
part runs whatever happened before it, a part that breaks is reported with its error and the next runs, and
everything measured goes into one record. Over the simulated NVML the same code runs, and the parts that need
`nvidia-smi` or PyTorch say in one line why they were skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import logging
import platform
import selectors
import shutil
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pynvml
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools import smi
from gpufleet.devtools.net import free_port, get
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.processes import Server, serving
from gpufleet.devtools.programs import gpufleet_command
from gpufleet.devtools.resources import cpu_seconds, peak_rss_mib, status_mib
from gpufleet.devtools.results import Table, Value
from gpufleet.devtools.stats import percentile
from gpufleet.devtools.waiting import HarnessError, wait_for
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.gpm import DETAIL, METRICS, GpmReader
from gpufleet.exporter.gpu.nvml import Nvml, as_text
from gpufleet.exporter.gpu.probes import FIELDS, PROBES, read_fields, utilization_probe
from gpufleet.exporter.gpu.session import NvmlSession, cuda_version
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.xid import NvmlXidWatcher, XidLedger

log = logging.getLogger(__name__)

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
# What loading NVML and opening every GPU adds to a process's memory: its heap and its mapped files, in MiB.
NVML_MEMORY = """
import os, pynvml
from gpufleet.devtools.resources import status_mib
before = status_mib(os.getpid())
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
after = status_mib(os.getpid())
print(after["RssAnon"] - before["RssAnon"], after["RssFile"] - before["RssFile"])
"""
# The series that show a load arrive: GPM's activities, and what the GPU reports without GPM.
LOAD_SERIES = ("gpufleet_gpu_tensor_active_ratio", "gpufleet_gpu_graphics_active_ratio", "gpufleet_gpu_sm_active_ratio",
               "gpufleet_gpu_dram_active_ratio", "gpufleet_gpu_utilization_ratio", "gpufleet_gpu_power_watts",
               "gpufleet_gpu_clock_hertz")
_RISE = 0.10  # How much tensor and graphics activity must rise under a bf16 matrix-multiply loop.
_EVENT_TYPES = {name.removeprefix("nvmlEventType"): value for name, value in vars(pynvml).items()
                if name.startswith("nvmlEventType") and name not in ("nvmlEventTypeAll", "nvmlEventTypeNone")
                and isinstance(value, int)}
_FABRIC_STATES = {pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not supported",
                  pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not started",
                  pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in progress",
                  pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed"}


@dataclass
class Options:
    out: Path
    backend: str = "nvml"  # nvml, or sim for the simulated library
    sim_gpus: int = 2
    rounds: int = 200  # collections timed
    calls: int = 50  # calls timed per NVML call and GPU
    smi_rounds: int = 5
    idle_seconds: float = 3.0  # GPM's window with the GPUs idle
    load_seconds: float = 5.0  # and under load
    quiet_seconds: float = 30.0  # the exporter at its default flags, scraped every 15 s, for its CPU share
    nvidia_smi: str | None = field(default_factory=lambda: shutil.which("nvidia-smi"))


@dataclass
class Report:
    """Everything the check found: figures and tables for the record, and one line per skip, failure and error."""

    figures: dict[str, Value] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds each part took

    def part(self, name: str, run: Callable[[], None]) -> None:
        """Run one part; an error in it is kept, with its traceback in the log, and the check goes on."""
        started = time.monotonic()
        try:
            run()
        # HarnessError is a SystemExit, which would end the whole check; any other error ends this part only.
        except (Exception, HarnessError) as err:  # noqa: BLE001
            self.errors.append(f"{name}: {type(err).__name__}: {err}")
            log.error("%s failed:\n%s", name, traceback.format_exc())
        self.timings[name] = round(time.monotonic() - started, 2)

    def summary(self) -> str:
        f = self.figures
        lines = [f"driver {f.get('driver_version')}, CUDA {f.get('cuda_version')}, {f.get('gpus')} x {f.get('board')}"]
        for phase in ("idle", "load"):
            if f"{phase}: fields matching" in f:
                lines.append(f"nvidia-smi against the exporter ({phase}): {f[f'{phase}: fields matching']} match, "
                             f"{f[f'{phase}: fields differing']} differ, {f[f'{phase}: fields the exporter lacks']} "
                             f"the exporter lacks, {f[f'{phase}: fields refused']} refused")
        if "GPU collection mean (ms)" in f:
            smi_mean = f.get("nvidia-smi query mean (ms)")
            lines.append(f"GPU collection: mean {f['GPU collection mean (ms)']} ms, p99 {f['GPU collection p99 (ms)']} "
                         f"ms, CPU {f['GPU collection CPU mean (ms)']} ms, "
                         f"{f['GPU collection CPU without the slow reads (ms)']} ms without the slow reads"
                         + (f"; nvidia-smi --query-gpu: mean {smi_mean} ms" if smi_mean is not None else ""))
            lines.append("GPU collection CPU at default flags, 8 GPUs: "
                         f"{f['GPU collection CPU at default flags, 8 GPUs (share of a core)']:.2%} of a core")
        for key in ("exporter CPU at default flags (share of a core)", "exporter peak RSS at default flags (MiB)",
                    "NVML loaded and opened: heap (MiB)"):
            if key in f:
                lines.append(f"{key}: {f[key]}")
        if "calls refused by the driver" in f:
            lines.append(f"calls refused by the driver: {f['calls refused by the driver']}")
        for key in ("tensor active idle", "tensor active under load", "graphics active idle",
                    "graphics active under load", "recovery action field (230)",
                    "GPU fabric info", "supported event types", "XID watcher registered",
                    "XID events registered (exporter)", "gpu tests"):
            if key in f:
                lines.append(f"{key}: {f[key]}")
        lines += [f"skipped: {line}" for line in self.skipped]
        lines += [f"FAILED: {line}" for line in self.failures]
        lines += [f"ERROR: {line}" for line in self.errors]
        return "\n".join(lines)


def library(options: Options) -> Nvml:
    """The NVML library the check reads in this process: the driver's, or simulated boards."""
    if options.backend == "sim":
        return SimulatedNvml(simulated_gpus(options.sim_gpus))
    driver: Nvml = pynvml
    return driver


@contextlib.contextmanager
def initialised(nvml: Nvml) -> Iterator[list[Any]]:
    """NVML initialised for one part, and every GPU's handle."""
    nvml.nvmlInit()
    try:
        yield [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def environment(nvml: Nvml, options: Options, report: Report) -> None:
    f = report.figures
    with initialised(nvml) as handles:
        f["driver_version"] = as_text(nvml.nvmlSystemGetDriverVersion())
        f["cuda_version"] = cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
        f["gpus"] = len(handles)
        f["board"] = ", ".join(sorted({as_text(nvml.nvmlDeviceGetName(h)) for h in handles}))
    f["backend"] = options.backend
    f["nvidia-ml-py"] = _version("nvidia-ml-py")
    f["python"] = platform.python_version()
    f["torch"] = _version("torch") or "not installed"
    if options.nvidia_smi:
        done = subprocess.run([options.nvidia_smi, "--version"], capture_output=True, text=True, timeout=30)
        f["nvidia-smi"] = " ".join(done.stdout.split()[:12])


def nvml_memory(options: Options, report: Report) -> None:
    if options.backend == "sim":
        report.skipped.append("NVML's own memory: the simulated library is not the driver's")
        return
    done = subprocess.run([sys.executable, "-c", NVML_MEMORY], capture_output=True, text=True, timeout=60, check=True,
                          cwd=ROOT)
    heap, files = (float(part) for part in done.stdout.split())
    report.figures["NVML loaded and opened: heap (MiB)"] = round(heap, 1)
    report.figures["NVML loaded and opened: mapped files (MiB)"] = round(files, 1)


def _error_name(code: int) -> str:
    return str(pynvml.NVMLError(code))


def refusals(nvml: Nvml, report: Report) -> None:
    """Every call and field the exporter asks for, one at a time on each GPU, and what the driver refuses, in the
    names the simulated board's `unsupported` set uses."""
    table = Table(["gpu", "call or field", "answer", "simulated board's name"])
    with initialised(nvml) as handles:
        for index, handle in enumerate(handles):
            for probe in (utilization_probe(), *PROBES):
                try:
                    probe.read(nvml, handle)
                except pynvml.NVMLError as err:
                    table.add(index, probe.name, str(err), probe.name.split("(")[0])
            for fld in FIELDS:
                [value] = nvml.nvmlDeviceGetFieldValues(handle, [fld.field_id])
                if value.nvmlReturn != pynvml.NVML_SUCCESS:
                    table.add(index, f"field {fld.field_id} ({fld.description})", _error_name(value.nvmlReturn),
                              f"field:{fld.field_id}")
            for name, call in (("nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode),
                               ("nvmlDeviceGetComputeRunningProcesses", nvml.nvmlDeviceGetComputeRunningProcesses)):
                try:
                    call(handle)
                except pynvml.NVMLError as err:
                    table.add(index, name, str(err), name)
            try:
                if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                    table.add(index, "nvmlGpmQueryDeviceSupport", "not a GPM device", "gpm_supported = False")
            except pynvml.NVMLError as err:
                table.add(index, "nvmlGpmQueryDeviceSupport", str(err), "gpm_supported = False")
            links = 0
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                with contextlib.suppress(pynvml.NVMLError):
                    nvml.nvmlDeviceGetNvLinkState(handle, link)
                    links += 1
            report.figures[f"GPU {index} NVLinks"] = links
    report.tables["refused by the driver"] = table
    report.figures["calls refused by the driver"] = ", ".join(sorted({str(row[1]) for row in table.rows})) or "none"


def _fabric(nvml: Any, handle: Any) -> str:
    """NVSwitch fabric registration as the driver reports it, through the newest structure it accepts."""
    for function, structure in (("nvmlDeviceGetGpuFabricInfoV", getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)),
                                ("nvmlDeviceGetGpuFabricInfoV", getattr(pynvml, "c_nvmlGpuFabricInfo_v2_t", None)),
                                ("nvmlDeviceGetGpuFabricInfo", getattr(pynvml, "c_nvmlGpuFabricInfo_t", None))):
        call = getattr(nvml, function, None)
        if call is None or structure is None:
            continue
        info = structure()
        try:
            call(handle, ctypes.byref(info))
        except pynvml.NVMLError as err:
            if err.value in (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                continue
            return f"{function}: {err}"
        parts = [f"{function}: state {_FABRIC_STATES.get(info.state, info.state)}",
                 f"status {_error_name(info.status)}", f"clique {info.cliqueId}",
                 f"cluster {bytes(info.clusterUuid).hex()}"]
        if hasattr(info, "healthMask"):
            parts.append(f"health mask {info.healthMask:#x}")
        return ", ".join(parts)
    return ""


def pager(nvml: Nvml, options: Options, report: Report) -> None:
    """What the pager work reads from a real driver: the recovery-action field, the event types the GPU can
    report, NVSwitch fabric registration, and whether the XID watcher registers."""
    f = report.figures
    actions, events, fabric = [], [], []
    with initialised(nvml) as handles:
        for index, handle in enumerate(handles):
            [value] = nvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
            actions.append(f"GPU {index}: " + (f"{value.value.uiVal}" if value.nvmlReturn == pynvml.NVML_SUCCESS
                                              else _error_name(value.nvmlReturn)))
            try:
                mask = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                events.append(f"GPU {index}: " + " ".join(n for n, bit in _EVENT_TYPES.items() if mask & bit))
            except pynvml.NVMLError as err:
                events.append(f"GPU {index}: {err}")
            answer = _fabric(nvml, handle)
            if answer:
                fabric.append(f"GPU {index}: {answer}")
    f["recovery action field (230)"] = "; ".join(actions)
    f["supported event types"] = "; ".join(events)
    if fabric:
        f["GPU fabric info"] = "; ".join(fabric)
    else:
        report.skipped.append(f"GPU fabric info: the {options.backend} NVML library has no nvmlDeviceGetGpuFabricInfo")
    ledger = XidLedger()
    watcher = NvmlXidWatcher(nvml, ledger, wait_ms=200)
    watcher.start()
    try:
        registered = _within(lambda: ledger.watching, 5.0)
    finally:
        watcher.stop()
    f["XID watcher registered"] = "yes" if registered else "no"
    if not registered:
        report.failures.append("the XID watcher did not register NVML events within 5 s")


def _within(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@contextlib.contextmanager
def running(options: Options, *flags: str) -> Iterator[Server]:
    """`gpufleet exporter` on this machine's GPUs (or simulated ones), once its first GPU collection is served."""
    port = free_port()
    backend = ["--gpu.backend=sim", f"--sim.gpus={options.sim_gpus}"] if options.backend == "sim" else [
        "--gpu.backend=nvml"]
    argv = gpufleet_command("exporter", *backend, *flags, f"--web.listen-address=127.0.0.1:{port}")
    with serving(argv, port, "/metrics", "exporter start", timeout=60) as server:
        wait_for(lambda: b"gpufleet_gpu_info{" in get(server.url + "/metrics"), 30, "the first GPU collection")
        yield server


@contextlib.contextmanager
def exporter(options: Options, report: Report) -> Iterator[Server]:
    """The exporter collecting every second, for the comparisons; its CPU and memory over them, and its log."""
    with running(options, "--collector.gpu.interval=1s") as server:
        try:
            process = psutil.Process(server.pid)
            started, cpu = time.monotonic(), cpu_seconds(process)
            yield server
            # Collecting every second while scraped a few times a second: an upper bound of its default cost.
            report.figures["exporter CPU at 1 s GPU interval (share of a core)"] = round(
                (cpu_seconds(process) - cpu) / (time.monotonic() - started), 4)
            report.figures["exporter peak RSS (MiB)"] = round(peak_rss_mib(server.pid), 1)
            memory = status_mib(server.pid)  # The heap, against the libraries mapped from files (NVML's among them).
            for key in ("RssAnon", "RssFile"):
                report.figures[f"exporter {key} (MiB)"] = round(memory.get(key, 0.0), 1)
        finally:
            (options.out / "exporter.log").write_text(server.output(limit=200_000))


def quiet(options: Options, report: Report) -> None:
    """The exporter at its default flags, scraped as Prometheus would, for what it costs a node at rest."""
    with running(options) as server:
        process = psutil.Process(server.pid)
        started, cpu = time.monotonic(), cpu_seconds(process)
        deadline = started + options.quiet_seconds
        while time.monotonic() < deadline:
            get(server.url + "/metrics")
            time.sleep(max(0.0, min(15.0, deadline - time.monotonic())))
        share = (cpu_seconds(process) - cpu) / (time.monotonic() - started)
        report.figures["exporter CPU at default flags (share of a core)"] = round(share, 4)
        report.figures["exporter CPU window (s)"] = options.quiet_seconds
        report.figures["exporter peak RSS at default flags (MiB)"] = round(peak_rss_mib(server.pid), 1)


def scrape(server: Server) -> tuple[str, smi.Samples]:
    text = get(server.url + "/metrics").decode()
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    return text, samples


_LAST_GPU_COLLECTION = ("gpufleet_collector_last_success_timestamp_seconds", frozenset({("collector", "gpu")}))


def fresh_scrape(server: Server) -> tuple[str, smi.Samples]:
    """A scrape taken just after the exporter's next GPU collection, so that what it shows is at most a few
    milliseconds older than a query made right after it; the last one seen if none comes within 5 s."""
    text, samples = scrape(server)
    before = samples.get(_LAST_GPU_COLLECTION)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        time.sleep(0.02)
        text, samples = scrape(server)
        if samples.get(_LAST_GPU_COLLECTION) != before:
            break
    return text, samples


def against_smi(server: Server, options: Options, report: Report, phase: str) -> None:
    """A scrape just after a GPU collection and an nvidia-smi query right after it, compared field by field."""
    text, samples = fresh_scrape(server)
    (options.out / f"metrics-{phase}.txt").write_text(text)
    registered = samples.get(("gpufleet_gpu_xid_events_registered", frozenset()))
    report.figures["XID events registered (exporter)"] = "yes" if registered == 1 else "no"
    if options.nvidia_smi is None:
        report.skipped.append(f"nvidia-smi comparison ({phase}): nvidia-smi is not installed")
        return
    rows, unknown = smi.query(options.nvidia_smi)
    verdicts = smi.compare(rows, unknown, samples)
    table = Table(["gpu", "field", "nvidia-smi", "exporter", "verdict", "window"])
    for v in verdicts:
        table.add(v.gpu, v.field, v.smi, v.exporter, v.verdict, v.window)
    report.tables[f"nvidia-smi against the exporter ({phase})"] = table
    counts: dict[str, int] = defaultdict(int)
    for v in verdicts:
        counts[v.verdict] += 1
    f = report.figures
    f[f"{phase}: fields matching"] = counts["match"]
    f[f"{phase}: fields differing"] = counts["differs"]
    f[f"{phase}: fields the exporter lacks"] = counts["exporter lacks it"]
    f[f"{phase}: fields refused"] = counts["refused by both"] + counts["refused by nvidia-smi"]
    f[f"{phase}: fields unknown to nvidia-smi"] = ", ".join(unknown) or "none"
    for v in verdicts:
        if v.verdict in ("differs", "exporter lacks it"):
            report.failures.append(f"{phase}: GPU {v.gpu} {v.field}: nvidia-smi {v.smi!r}, exporter {v.exporter!r} "
                                   f"({v.verdict}, window {v.window or 'none'})")


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


def activity(nvml: Nvml, server: Server | None, options: Options, report: Report) -> None:
    """GPM and the GPU's own utilisation with the GPUs idle, then under a matrix-multiply loop on each."""
    session = NvmlSession(nvml, gpm=METRICS + DETAIL)
    try:
        idle = _activity(session, options.idle_seconds)
        busy: dict[tuple[int, str], float] = {}
        if options.backend == "sim":
            report.skipped.append("load: the simulated GPUs run their own load, not PyTorch's")
        elif not _version("torch"):
            report.skipped.append("load: PyTorch is not installed")
        else:
            with load(options.load_seconds + 60):
                time.sleep(1.0)  # The first collection under load reads from before it began.
                busy = _activity(session, options.load_seconds)
                if server is not None:
                    against_smi(server, options, report, "load")
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
    its own function, the newest utilisation sample alone, the violation counters' cheap sibling. Only where the
    library has them (the simulated one does not)."""
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
    # At the default flags (every 5 s, the slow reads every 15 s), per GPU and for an 8-GPU node, as a share of one
    # core: the exporter's budget is 1 % for everything.
    per_collection = _mean(fast.cpu) + (_mean(every.cpu) - _mean(fast.cpu)) / 3
    gpus = len(every.gpus) or 1
    f["GPU collection CPU at default flags, per GPU (share of a core)"] = round(per_collection / 5.0 / gpus, 5)
    f["GPU collection CPU at default flags, 8 GPUs (share of a core)"] = round(8 * per_collection / 5.0 / gpus, 4)
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
    f["nvidia-smi query mean (ms)"] = round(sum(runs) / len(runs), 1)
    f["nvidia-smi query max (ms)"] = round(max(runs), 1)


def gpu_tests(options: Options, report: Report) -> None:
    """The tests marked `gpu`, in the files that have them: the others need packages the GPU machine lacks."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "pytest.mark.gpu" in p.read_text())
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    (options.out / "pytest.log").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    report.figures["gpu tests"] = last
    if done.returncode not in (0, 5):  # 5: every test deselected or skipped, as without a GPU.
        report.failures.append(f"gpu tests: {last}")


def run(options: Options) -> Report:
    """Every part in order; each one's failure is kept and the next runs."""
    options.out.mkdir(parents=True, exist_ok=True)
    report = Report()
    nvml = library(options)
    report.part("environment", lambda: environment(nvml, options, report))
    report.part("refusals", lambda: refusals(nvml, report))
    report.part("NVML memory", lambda: nvml_memory(options, report))
    report.part("pager", lambda: pager(nvml, options, report))

    def with_exporter() -> None:
        with exporter(options, report) as server:
            report.part("compare idle", lambda: against_smi(server, options, report, "idle"))
            report.part("activity", lambda: activity(nvml, server, options, report))

    report.part("exporter", with_exporter)
    report.part("exporter at default flags", lambda: quiet(options, report))
    report.part("timing", lambda: timing(nvml, options, report))
    report.part("gpu tests", lambda: gpu_tests(options, report))
    return report
