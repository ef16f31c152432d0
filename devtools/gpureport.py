"""What the real-GPU check (`devtools/gpucheck.py`) is asked to do and what it found: its options, and a report
that keeps every part's figures, tables, skips, failures and errors, so that one part's trouble stops no other."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devtools.results import Table, Value
from gpufleet.devtools.waiting import HarnessError
from gpufleet.exporter.gpu.nvml import Nvml

log = logging.getLogger(__name__)


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

    def number(self, key: str, default: float | None = None) -> float:
        """A figure an earlier part measured, as a number; `default` where it has none (a skipped part)."""
        value = self.figures.get(key, default)
        if not isinstance(value, int | float):
            raise KeyError(f"no figure {key!r} to work from: did its part run?")
        return float(value)

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
                    "NVML loaded and opened: heap (MiB)",
                    "model: projected exporter CPU at default flags (share of a core)",
                    "model: measured / projected CPU", "model: projected peak RSS at default flags (MiB)",
                    "model: measured / projected peak RSS",
                    "model: calls counted differently over the simulated boards"):
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


@contextlib.contextmanager
def initialised(nvml: Nvml) -> Iterator[list[Any]]:
    """NVML initialised for one part, and every GPU's handle."""
    nvml.nvmlInit()
    try:
        yield [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()


def installed(package: str) -> str:
    """The installed version of a distribution, or "" where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""
