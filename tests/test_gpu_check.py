"""The real-GPU check (`bench/gpu_check.py`): its comparison with nvidia-smi on what a real H200 gave, and the
whole check over the simulated NVML, so that little is left to fail the first time it meets a GPU.

The H200 fixtures are one idle scrape of the exporter and the nvidia-smi values read just after it, from the run
recorded in bench/results/gpu_check.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.devtools import smi
from gpufleet.devtools.paths import FIXTURES, ROOT

from helpers import parse

H200 = FIXTURES / "gpu-check"
REFUSED_ON_H200 = ["fan.speed", "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count",
                   "retired_pages.pending"]


def h200() -> tuple[list[dict[str, str]], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    samples = parse((H200 / "h200-metrics.txt").read_text())
    return smi.parse((H200 / "h200-nvidia-smi.csv").read_text(), smi.FIELDS), samples


def verdicts(rows, samples, unknown=()) -> dict[str, str]:
    return {v.field: v.verdict for v in smi.compare(rows, list(unknown), samples)}


def test_every_field_of_a_real_h200_agrees_with_nvidia_smi_or_is_refused_by_both():
    rows, samples = h200()
    found = verdicts(rows, samples)
    assert len(found) == len(smi.CHECKS) == 44
    assert [field for field, verdict in found.items() if verdict != "match"] == REFUSED_ON_H200
    assert {found[field] for field in REFUSED_ON_H200} == {"refused by both"}
    # The exporter leaves the pending MIG mode out while it equals the current one; that is agreement.
    assert found["mig.mode.pending"] == "match"


def test_a_value_outside_its_window_differs_and_a_missing_series_or_unknown_field_is_named():
    rows, samples = h200()
    key = next(k for k in samples if k[0] == "gpufleet_gpu_power_watts")
    samples[key] += 20.0  # 80.7 W read, so the window is 15 W.
    used = next(k for k in samples if k[0] == "gpufleet_gpu_memory_used_bytes")
    samples[used] += 615 * smi.MIB  # What the driver reserves, counted as used by NVML's first memory call.
    del samples[next(k for k in samples if k[0] == "gpufleet_gpu_temperature_celsius")]
    rows[0]["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
    found = verdicts(rows, samples, unknown=["temperature.gpu.tlimit"])
    assert found["power.draw"] == found["memory.used"] == found["uuid"] == "differs"
    assert found["temperature.gpu"] == "exporter lacks it"
    assert found["temperature.gpu.tlimit"] == "unknown to nvidia-smi"
    assert found["memory.free"] == "match"


def test_unreadable_and_refused_values_are_told_apart_from_disagreement():
    rows, samples = h200()
    rows[0]["pstate"] = "[Unknown Error]"
    rows[0]["ecc.mode.current"] = "Sometimes"
    found = verdicts(rows, samples)
    assert found["pstate"] == "refused by nvidia-smi"
    assert found["ecc.mode.current"] == "unreadable"


@pytest.mark.slow
@pytest.mark.e2e
def test_the_whole_check_runs_over_the_simulated_nvml_and_writes_what_it_found(tmp_path: Path):
    results = tmp_path / "results.json"
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(tmp_path / "out"),
                           "--gpu.backend=sim", "--rounds=20", "--calls=5", "--quiet-seconds=3"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 120
    [run] = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["runs"]
    figures, tables = run["figures"], run["tables"]
    assert (figures["backend"], figures["gpus"], figures["board"]) == ("sim", 2, "NVIDIA H100 80GB HBM3")
    assert figures["XID watcher registered"] == figures["XID events registered (exporter)"] == "yes"
    assert figures["recovery action field (230)"] == "GPU 0: 0; GPU 1: 0"
    assert figures["GPU collection CPU without the slow reads (ms)"] > 0 and figures["GPU collection CPU mean (ms)"] > 0
    assert 0 <= figures["exporter CPU at default flags (share of a core)"] < 0.5
    assert figures["exporter peak RSS at default flags (MiB)"] > 10
    # The simulated H100 refuses what a real one does, each named as the simulated board's set names it.
    refused = {row[3] for row in tables["refused by the driver"]["rows"]}
    assert refused == {"field:29", "field:30", "field:31", "nvmlDeviceGetFanSpeed_v2"}
    activity = {(row[0], row[1]): row[2] for row in tables["activity, idle and under load"]["rows"]}
    assert 0 <= activity[(0, "gpufleet_gpu_tensor_active_ratio")] <= 1
    calls = {row[0] for row in tables["NVML calls"]["rows"]}
    assert {"nvmlDeviceGetFieldValues (all fields)", "GPM (sample and metrics)", "nvmlDeviceGetMigMode"} <= calls
    # The calls as the collector makes them, by tier, and the cost model checked against the exporter measured:
    # simulated boards made like these make exactly the calls these made.
    ordered = {(row[1], row[0]): row[2] for row in tables["NVML calls in the collector's order"]["rows"]}
    assert ordered[("counter", "nvmlDeviceGetViolationStatus(0)")] == 1
    assert ("fast", "nvmlDeviceGetViolationStatus(0)") not in ordered
    assert ordered[("fast", "nvmlDeviceGetNvLinkState")] == 18
    assert figures["model: calls counted differently over the simulated boards"] == "none"
    assert 0 < figures["model: projected exporter CPU at default flags (share of a core)"] < 0.5
    # What needs nvidia-smi or PyTorch says in one line why it did not run; nothing broke.
    assert "skipped: nvidia-smi comparison (idle): nvidia-smi is not installed" in run["notes"]
    assert "skipped: load: the simulated GPUs run their own load" in run["notes"]
    assert "error:" not in run["notes"] and "failed:" not in run["notes"]
    assert (tmp_path / "out" / "metrics-idle.txt").read_text().count("gpufleet_gpu_info{") == 2
    assert not results.exists()

    merged = tmp_path / "merged.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--merge",
                    str(tmp_path / "out" / "gpu_check.json"), "--commit", "abc1234", "--results", str(merged)],
                   check=True, capture_output=True, timeout=60, cwd=ROOT)
    [kept] = json.loads(merged.read_text())["runs"]
    assert (kept["commit"], kept["changed"], kept["figures"]) == ("abc1234", False, figures)
