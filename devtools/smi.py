"""The exporter's values against `nvidia-smi --query-gpu`, field by field, with the tolerance each field needs.

nvidia-smi reads the same driver through the same library, so where both answer they must agree: exactly for
identity, sizes, modes and counters, within a sampling window for what moves (power, clocks, temperatures,
utilisation). The two are read a moment apart, so the tolerances of moving values say how far one may drift
between two reads, not how wrong the exporter may be.

nvidia-smi answers `[N/A]` or `[Not Supported]` for what the driver refuses, and rejects the whole query
for a field name it does not know, which older drivers do for newer fields: `query` then asks field by field.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.exporter.gpu.probes import CLOCK_EVENT_REASONS

Labels = frozenset[tuple[str, str]]
Samples = Mapping[tuple[str, Labels], float]

MIB = 1024**2
_MHZ = 1e6
_REFUSALS = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]",
             "[GPU requires reset]", "[Not Available]")
_YES = {"enabled": 1.0, "yes": 1.0, "active": 1.0, "disabled": 0.0, "no": 0.0, "not active": 0.0}


def _number(text: str) -> float:
    return float(text)


def _flag(text: str) -> float:
    return _YES[text.strip().lower()]


def _pstate(text: str) -> float:
    return float(text.strip().upper().removeprefix("P"))


def _mask(text: str) -> float:
    return float(int(text, 16))


@dataclass(frozen=True)
class Check:
    """One nvidia-smi field and the exporter series it must agree with.

    `label` names a `gpufleet_gpu_info` label for identity fields; otherwise `metric` and `labels` name the
    series, `scale` turns nvidia-smi's unit into the exporter's, and a value agrees within `absolute` or
    `relative` (of the larger of the two), whichever is wider. `otherwise` names the series whose value the
    exporter means by leaving `metric` out (a pending mode is exported only while it differs from the current).
    """

    field: str
    metric: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    label: str = ""
    parse: Callable[[str], float] = _number
    scale: float = 1.0
    absolute: float = 0.0
    relative: float = 0.0
    otherwise: str = ""


def _share(field: str, metric: str, *labels: tuple[str, str]) -> Check:
    """A percentage in nvidia-smi, a ratio in the exporter; utilisation moves from one sample period to the next."""
    return Check(field, metric, labels, scale=0.01, absolute=0.10)


CHECKS: tuple[Check, ...] = (
    Check("uuid", label="uuid"),
    Check("name", label="name"),
    Check("pci.bus_id", label="pci_bus_id"),
    Check("serial", label="serial"),
    Check("vbios_version", label="vbios"),
    Check("driver_version", label="driver_version"),
    Check("memory.total", "gpufleet_gpu_memory_total_bytes", scale=MIB),
    # nvidia-smi leaves the driver's reserved memory out of `used` where NVML's first memory call counts it in:
    # a difference of that size is a finding to note, not noise, so the window is one allocation granule.
    Check("memory.used", "gpufleet_gpu_memory_used_bytes", scale=MIB, absolute=64 * MIB),
    Check("memory.free", "gpufleet_gpu_memory_free_bytes", scale=MIB, absolute=64 * MIB),
    Check("power.draw", "gpufleet_gpu_power_watts", absolute=15.0, relative=0.10),
    Check("enforced.power.limit", "gpufleet_gpu_power_limit_watts", absolute=1.0),
    Check("temperature.gpu", "gpufleet_gpu_temperature_celsius", absolute=2.0),
    Check("temperature.memory", "gpufleet_gpu_memory_temperature_celsius", absolute=2.0),
    Check("temperature.gpu.tlimit", "gpufleet_gpu_thermal_margin_celsius", absolute=2.0),
    Check("clocks.sm", "gpufleet_gpu_clock_hertz", (("clock", "sm"),), scale=_MHZ, absolute=30 * _MHZ, relative=0.05),
    Check("clocks.mem", "gpufleet_gpu_clock_hertz", (("clock", "memory"),), scale=_MHZ, absolute=30 * _MHZ,
          relative=0.05),
    Check("clocks.max.sm", "gpufleet_gpu_clock_max_hertz", (("clock", "sm"),), scale=_MHZ),
    Check("clocks.max.mem", "gpufleet_gpu_clock_max_hertz", (("clock", "memory"),), scale=_MHZ),
    _share("utilization.gpu", "gpufleet_gpu_utilization_ratio"),
    _share("utilization.memory", "gpufleet_gpu_memory_copy_utilization_ratio"),
    _share("utilization.encoder", "gpufleet_gpu_encoder_utilization_ratio"),
    _share("utilization.decoder", "gpufleet_gpu_decoder_utilization_ratio"),
    Check("pstate", "gpufleet_gpu_performance_state", parse=_pstate),
    Check("fan.speed", "gpufleet_gpu_fan_speed_ratio", (("fan", "0"),), scale=0.01, absolute=0.05),
    Check("pcie.link.gen.current", "gpufleet_gpu_pcie_link_generation"),
    Check("pcie.link.gen.max", "gpufleet_gpu_pcie_link_max_generation"),
    Check("pcie.link.width.current", "gpufleet_gpu_pcie_link_width"),
    Check("pcie.link.width.max", "gpufleet_gpu_pcie_link_max_width"),
    Check("ecc.mode.current", "gpufleet_gpu_ecc_enabled", parse=_flag),
    Check("ecc.mode.pending", "gpufleet_gpu_ecc_pending_enabled", parse=_flag),
    *(Check(f"ecc.errors.{error}.{scope}.total", "gpufleet_gpu_ecc_errors_total",
            (("error", "corrected" if error == "corrected" else "uncorrected"), ("scope", scope)))
      for error in ("corrected", "uncorrected") for scope in ("volatile", "aggregate")),
    Check("retired_pages.single_bit_ecc.count", "gpufleet_gpu_retired_pages", (("cause", "single_bit"),)),
    Check("retired_pages.double_bit.count", "gpufleet_gpu_retired_pages", (("cause", "double_bit"),)),
    Check("retired_pages.pending", "gpufleet_gpu_retired_pages_pending", parse=_flag),
    Check("remapped_rows.correctable", "gpufleet_gpu_remapped_rows", (("cause", "correctable"),)),
    Check("remapped_rows.uncorrectable", "gpufleet_gpu_remapped_rows", (("cause", "uncorrectable"),)),
    Check("remapped_rows.pending", "gpufleet_gpu_row_remap_pending", parse=_flag),
    Check("remapped_rows.failure", "gpufleet_gpu_row_remap_failed", parse=_flag),
    Check("mig.mode.current", "gpufleet_gpu_mig_enabled", parse=_flag),
    Check("mig.mode.pending", "gpufleet_gpu_mig_pending_enabled", parse=_flag, otherwise="gpufleet_gpu_mig_enabled"),
    # The active reasons as one bit mask; the exporter's series are rebuilt into the same mask.
    Check("clocks_event_reasons.active", "gpufleet_gpu_clock_event_active", parse=_mask),
)
FIELDS = ("index", *(check.field for check in CHECKS))


@dataclass(frozen=True)
class Verdict:
    """One field on one GPU: both values as read, and what they say together."""

    gpu: str
    field: str
    smi: str
    exporter: str
    verdict: str  # match, differs, exporter lacks it, refused by both or by nvidia-smi, unknown to it, unreadable
    window: str = ""  # The tolerance applied, for the reader of a "differs".


def query(nvidia_smi: str, fields: Sequence[str] = FIELDS, timeout: float = 30.0) -> tuple[list[dict[str, str]],
                                                                                          list[str]]:
    """Each GPU's fields as nvidia-smi prints them, and the fields this nvidia-smi does not know.

    One query for all; where nvidia-smi rejects it (an unknown field fails the whole call), one per field."""
    done = subprocess.run([nvidia_smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode == 0:
        return parse(done.stdout, fields), []
    known, unknown = [], []
    columns: list[list[str]] = []
    for name in fields:
        one = subprocess.run([nvidia_smi, f"--query-gpu={name}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout)
        if one.returncode != 0:
            unknown.append(name)
            continue
        known.append(name)
        columns.append([line.strip() for line in one.stdout.strip().splitlines()])
    rows = [dict(zip(known, values, strict=True)) for values in zip(*columns, strict=True)]
    return rows, unknown


def parse(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """nvidia-smi's CSV without header: one line per GPU, values separated by ", "."""
    rows = []
    for line in text.strip().splitlines():
        values = [value.strip() for value in line.split(", ")]
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi printed {len(values)} values for {len(fields)} fields: {line!r}")
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def _refused(text: str) -> bool:
    return text == "" or text in _REFUSALS or text.startswith("[")


def _info(samples: Samples, gpu: str) -> dict[str, str]:
    for (name, labels), _ in samples.items():
        if name == "gpufleet_gpu_info" and dict(labels).get("gpu") == gpu:
            return dict(labels)
    return {}


def _series(samples: Samples, check: Check, gpu: str) -> float | None:
    if check.metric == "gpufleet_gpu_clock_event_active":
        bits = dict(CLOCK_EVENT_REASONS)
        active = [bits[dict(labels)["reason"]] for (name, labels), value in samples.items()
                  if name == check.metric and dict(labels).get("gpu") == gpu and value == 1.0]
        reasons = [labels for (name, labels) in samples if name == check.metric and dict(labels).get("gpu") == gpu]
        return float(sum(active)) if reasons else None
    wanted = {("gpu", gpu), *check.labels}
    for metric in (check.metric, check.otherwise):
        for (name, labels), value in samples.items():
            if metric and name == metric and wanted <= labels:
                return value
    return None


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def compare(rows: Sequence[Mapping[str, str]], unknown: Sequence[str], samples: Samples,
            checks: Sequence[Check] = CHECKS) -> list[Verdict]:
    """Every check on every GPU nvidia-smi listed, judged against the exporter's samples."""
    verdicts = []
    for row in rows:
        gpu = row["index"]
        info = _info(samples, gpu)
        for check in checks:
            if check.field in unknown or check.field not in row:
                verdicts.append(Verdict(gpu, check.field, "", "", "unknown to nvidia-smi"))
                continue
            text = row[check.field]
            if check.label:
                ours = info.get(check.label)
                if ours is None:
                    verdicts.append(Verdict(gpu, check.field, text, "", "exporter lacks it"))
                elif _refused(text):
                    verdicts.append(Verdict(gpu, check.field, text, ours,
                                            "refused by both" if ours == "" else "refused by nvidia-smi"))
                else:
                    same = ours.lower() == text.lower()
                    verdicts.append(Verdict(gpu, check.field, text, ours, "match" if same else "differs"))
                continue
            value = _series(samples, check, gpu)
            if _refused(text):
                verdicts.append(Verdict(gpu, check.field, text, "" if value is None else _fmt(value),
                                        "refused by both" if value is None else "refused by nvidia-smi"))
                continue
            try:
                expected = check.parse(text) * check.scale
            except (ValueError, KeyError):
                verdicts.append(Verdict(gpu, check.field, text, "" if value is None else _fmt(value), "unreadable"))
                continue
            if check.metric == "gpufleet_gpu_clock_event_active":  # Only the reasons the exporter names.
                expected = float(int(expected) & sum(bit for _, bit in CLOCK_EVENT_REASONS))
            if value is None:
                verdicts.append(Verdict(gpu, check.field, text, "", "exporter lacks it"))
                continue
            window = max(check.absolute, check.relative * max(abs(expected), abs(value)))
            same = abs(value - expected) <= window + 1e-9 * max(1.0, abs(expected))
            verdicts.append(Verdict(gpu, check.field, text, _fmt(value), "match" if same else "differs",
                                    _fmt(window) if window else "exact"))
    return verdicts
