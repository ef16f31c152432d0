"""The real-GPU check behind `bench/gpu_check.py`: each part of it, run in order, each failure kept and reported.

A GPU machine is lent for a few minutes at a time, with no network and nobody to fix a script halfway: every
part runs whatever happened before it, a part that breaks is reported with its error and the next runs, and
everything measured goes into one record. Over the simulated NVML the same code runs, and the parts that need
`nvidia-smi` or PyTorch say in one line why they were skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import psutil
import pynvml
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.devtools import smi
from gpufleet.devtools.gpuactivity import activity
from gpufleet.devtools.gpureport import Options, Report, initialised, installed
from gpufleet.devtools.gputiming import cost_model, timing
from gpufleet.devtools.net import free_port, get
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.processes import Server, serving
from gpufleet.devtools.programs import gpufleet_command
from gpufleet.devtools.resources import cpu_seconds, peak_rss_mib, status_mib
from gpufleet.devtools.results import Table
from gpufleet.devtools.waiting import HarnessError, wait_for
from gpufleet.exporter.gpu.nvml import Nvml, as_text
from gpufleet.exporter.gpu.probes import FIELDS, PROBES
from gpufleet.exporter.gpu.session import cuda_version
from gpufleet.exporter.gpu.simulated.host import simulated_gpus
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml
from gpufleet.exporter.gpu.utilization import utilization_probe
from gpufleet.exporter.gpu.xid import NvmlXidWatcher, XidLedger

SIMULATED_SECONDS = 15.0  # Long enough for the simulated exporter's memory to reach what it keeps.
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
_EVENT_TYPES = {name.removeprefix("nvmlEventType"): value for name, value in vars(pynvml).items()
                if name.startswith("nvmlEventType") and name not in ("nvmlEventTypeAll", "nvmlEventTypeNone")
                and isinstance(value, int)}
_FABRIC_STATES = {pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not supported",
                  pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not started",
                  pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in progress",
                  pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed"}


def library(options: Options) -> Nvml:
    """The NVML library the check reads in this process: the driver's, or simulated boards."""
    if options.backend == "sim":
        return SimulatedNvml(simulated_gpus(options.sim_gpus))
    driver: Nvml = pynvml
    return driver


def environment(nvml: Nvml, options: Options, report: Report) -> None:
    f = report.figures
    with initialised(nvml) as handles:
        f["driver_version"] = as_text(nvml.nvmlSystemGetDriverVersion())
        f["cuda_version"] = cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
        f["gpus"] = len(handles)
        f["board"] = ", ".join(sorted({as_text(nvml.nvmlDeviceGetName(h)) for h in handles}))
    f["backend"] = options.backend
    f["nvidia-ml-py"] = installed("nvidia-ml-py")
    f["python"] = platform.python_version()
    f["torch"] = installed("torch") or "not installed"
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
        wait_for(lambda: ledger.watching, 5.0, "the XID watcher's registration", interval=0.05)
        f["XID watcher registered"] = "yes"
    except HarnessError as err:
        f["XID watcher registered"] = "no"
        report.failures.append(str(err))
    finally:
        watcher.stop()


@contextlib.contextmanager
def running(options: Options, *flags: str, simulated: int | None = None, first: bool = True) -> Iterator[Server]:
    """`gpufleet exporter` on this machine's GPUs (or on `simulated` simulated ones, or on the simulated ones
    the options ask for), once its first GPU collection is served (unless not `first`: no GPU collector)."""
    port = free_port()
    if simulated is None and options.backend == "sim":
        simulated = options.sim_gpus
    backend = ["--gpu.backend=nvml"] if simulated is None else ["--gpu.backend=sim", f"--sim.gpus={simulated}"]
    argv = gpufleet_command("exporter", *backend, *flags, f"--web.listen-address=127.0.0.1:{port}")
    with serving(argv, port, "/metrics", "exporter start", timeout=60) as server:
        if first:
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


def at_rest(server: Server, seconds: float) -> float:
    """The exporter's CPU as a share of a core over `seconds`, scraped every 15 s as Prometheus would."""
    process = psutil.Process(server.pid)
    started, cpu = time.monotonic(), cpu_seconds(process)
    deadline = started + seconds
    while time.monotonic() < deadline:
        get(server.url + "/metrics")
        time.sleep(max(0.0, min(15.0, deadline - time.monotonic())))
    return (cpu_seconds(process) - cpu) / (time.monotonic() - started)


def quiet(options: Options, report: Report) -> None:
    """The exporter at its default flags, for what it costs a node at rest; without its GPU collector, for the
    part of that the cost model measures rather than projects; and over as many simulated GPUs, for its memory
    apart from NVML's."""
    f = report.figures
    with running(options) as server:
        f["exporter CPU at default flags (share of a core)"] = round(at_rest(server, options.quiet_seconds), 4)
        f["exporter CPU window (s)"] = options.quiet_seconds
        f["exporter peak RSS at default flags (MiB)"] = round(peak_rss_mib(server.pid), 1)
        memory = status_mib(server.pid)
        for key in ("RssAnon", "RssFile"):
            f[f"exporter {key} at default flags (MiB)"] = round(memory.get(key, 0.0), 1)
    with running(options, "--no-collector.gpu", first=False) as server:
        f["exporter CPU without the GPU collector (share of a core)"] = round(
            at_rest(server, options.quiet_seconds), 4)
    with running(options, simulated=int(report.number("gpus", options.sim_gpus))) as server:
        at_rest(server, min(SIMULATED_SECONDS, options.quiet_seconds))
        f["exporter peak RSS over the simulated library (MiB)"] = round(peak_rss_mib(server.pid), 1)


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
            report.part("activity", lambda: activity(nvml, options, report,
                                                     lambda: against_smi(server, options, report, "load")))

    report.part("exporter", with_exporter)
    report.part("exporter at default flags", lambda: quiet(options, report))
    report.part("timing", lambda: timing(nvml, options, report))
    report.part("cost model", lambda: cost_model(report))
    report.part("gpu tests", lambda: gpu_tests(options, report))
    return report
