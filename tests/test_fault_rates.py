"""Faults drawn from rates: as often as asked, where asked, the same for the same seed, and files checked.

The shipped Llama 3 profile is drawn over a 2,048-node fleet for the paper's 54 days: the number of
each kind must lie in the Poisson interval of what the profile asks for, and the total near the 404
interruptions the profile maps (419 in the paper, less the 15 no node metric can see).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gpufleet.devtools import months
from gpufleet.devtools.net import free_port
from gpufleet.simulator.faults import Fault, ScenarioError
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.history import History
from gpufleet.simulator.rates import DAY, draw, load_rates

LLAMA3 = Path(__file__).resolve().parent.parent / "simulator" / "fault-rates" / "llama3.yml"
PORTS = (*(f"mlx5_{i}/1" for i in range(8)), "eth0", "eth1")


def poisson_interval(mean: float, z: float = 3.3) -> tuple[float, float]:
    """A two-sided interval holding a Poisson count with this mean about 99.9% of the time (normal
    approximation with a continuity margin, good enough for the means drawn here)."""
    spread = z * math.sqrt(mean) + 1
    return mean - spread, mean + spread


def test_the_llama3_profile_draws_as_many_faults_as_the_paper_counts() -> None:
    rates = load_rates(LLAMA3.read_text())
    nodes = {f"n{i:04d}": PORTS for i in range(2048)}
    faults = draw(rates, nodes, 8, 54 * DAY, seed=3, ids=itertools.count(1))
    by_cause = Counter()
    for fault in faults:
        by_cause[(fault.kind, fault.xid, fault.duration)] += 1
    units = {"gpu": 2048 * 8, "port": 2048 * 8, "node": 2048}
    for rate in rates:
        low, high = poisson_interval(rate.per_day * units[rate.per] * 54)
        assert low <= by_cause[(rate.kind, rate.xid, rate.duration)] <= high, rate
    low, high = poisson_interval(404)
    assert low <= len(faults) <= high
    assert all(0 <= f.start < 54 * DAY for f in faults)
    assert [f.start for f in faults] == sorted(f.start for f in faults)


def test_each_fault_lands_on_a_unit_of_its_kind() -> None:
    rates = load_rates("faults:\n"
                       "  - {cause: a, kind: gpu_lost, per: gpu, rate: 2, duration: 1h}\n"
                       "  - {cause: b, kind: ib_link_down, per: port, rate: 2, duration: 1h}\n"
                       "  - {cause: c, kind: exporter_down, per: node, rate: 2, duration: 1h}\n"
                       "  - {cause: d, kind: nvlink_down, per: gpu, rate: 2, duration: 1h}\n"
                       "  - {cause: e, kind: xid, xid: 119, per: gpu, rate: 2, duration: 1m}\n")
    faults = draw(rates, {"n1": PORTS, "n2": PORTS}, 4, 10 * DAY, seed=1, ids=itertools.count(1))
    kinds = {f.kind for f in faults}
    assert kinds == {"gpu_lost", "ib_link_down", "exporter_down", "nvlink_down", "xid"}
    for fault in faults:
        assert fault.node in ("n1", "n2") and fault.duration == (60 if fault.kind == "xid" else 3600)
        if fault.kind in ("gpu_lost", "nvlink_down", "xid"):
            assert fault.gpu in range(4) and fault.port is None
        if fault.kind == "ib_link_down":
            assert fault.port in PORTS[:8] and fault.gpu is None  # InfiniBand ports only, not eth0.
        if fault.kind == "nvlink_down":
            assert fault.link in range(18)
        if fault.kind == "xid":
            assert fault.xid == 119
    # Over 2 nodes of 4 GPUs for 10 days at 2 a GPU-day: about 160 lost GPUs; over 16 ports, 320 link downs.
    counts = Counter(f.kind for f in faults)
    for kind, mean in (("gpu_lost", 160), ("ib_link_down", 320), ("exporter_down", 40)):
        low, high = poisson_interval(mean)
        assert low <= counts[kind] <= high, (kind, counts[kind])


def test_the_same_seed_draws_the_same_faults_and_another_seed_others() -> None:
    rates = load_rates(LLAMA3.read_text())
    nodes = {f"n{i}": PORTS for i in range(256)}

    def drawn(seed: int) -> list[tuple[str, str, float, int | None, str | None]]:
        faults = draw(rates, nodes, 8, 365 * DAY, seed, itertools.count(1))
        return [(f.kind, f.node, f.start, f.gpu, f.port) for f in faults]

    assert drawn(5) == drawn(5)
    assert drawn(5) != drawn(6)


@pytest.mark.parametrize(("text", "message"), [
    ("faults: [{cause: a, kind: meltdown, per: gpu, rate: 1, duration: 1h}]", "rate 1: kind 'meltdown' is not one of"),
    ("faults: [{cause: a, kind: gpu_lost, per: node, rate: 1, duration: 1h}]",
     "kind gpu_lost strikes one gpu, so its rate is per gpu, not per 'node'"),
    ("faults: [{cause: a, kind: gpu_lost, per: gpu, rate: -1, duration: 1h}]", "rate must be a number"),
    ("faults: [{cause: a, kind: gpu_lost, per: gpu, rate: often, duration: 1h}]", "rate must be a number"),
    ("faults: [{cause: a, kind: gpu_lost, per: gpu, rate: 1, duration: 0}]", "duration must be above 0"),
    ("faults: [{cause: a, kind: gpu_lost, per: gpu, rate: 1, duration: soon}]", "duration: invalid duration 'soon'"),
    ("faults: [{cause: a, kind: xid, per: gpu, rate: 1, duration: 1m}]", "kind xid needs 'xid'"),
    ("faults: [{cause: a, kind: gpu_lost, xid: 79, per: gpu, rate: 1, duration: 1m}]", "kind gpu_lost takes no xid"),
    ("faults: [{kind: gpu_lost, per: gpu, rate: 1, duration: 1m}]", "rate 1: needs 'cause'"),
    ("faults: [{cause: a, kind: gpu_lost, per: gpu, rate: 1, duration: 1m, node: n1}]", "unknown field 'node'"),
    ("faults: [oops", "not valid YAML"),
    ("rates: []", "expected a mapping with a 'faults' list"),
])
def test_rate_files_are_checked_with_clear_messages(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_rates(text)


def test_simulate_names_the_rates_file_and_its_fault(tmp_path: Path) -> None:
    rates = tmp_path / "rates.yml"
    rates.write_text("faults: [{cause: a, kind: gpu_lost, per: port, rate: 1, duration: 1h}]\n")
    for path, message in ((rates, f"fault rates {rates}: rate 1: kind gpu_lost strikes one gpu"),
                          (tmp_path / "missing.yml", "cannot read: No such file or directory")):
        run = subprocess.run([sys.executable, "-m", "gpufleet", "simulate", "--nodes=1", f"--fault-rates={path}",
                              f"--web.listen-address=127.0.0.1:{free_port()}"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and message in run.stderr, run.stderr


def test_history_records_a_down_exporter_as_prometheus_would() -> None:
    fleet = Fleet(2, 2, seed=0)
    fleet.add([Fault("down", "exporter_down", "gpu-node-0001", 300, 3600)])
    try:
        families = asyncio.run(History(fleet, 0, re.compile("gpufleet_gpu_up"), {"cluster": "c"}).samples(0, 7200, 600))
    finally:
        fleet.close()
    up = {(line.split('instance="')[1].split('"')[0], float(line.split()[-1])): line.split()[1]
          for line in families["up"]}
    assert up[("gpu-node-0001", 600)] == "0" and up[("gpu-node-0002", 600)] == "1"
    assert up[("gpu-node-0001", 7200)] == "1"
    gpus = [line for line in families["gpufleet_gpu_up"] if 'instance="gpu-node-0001"' in line]
    assert not any(line.endswith(" 600.000") for line in gpus)  # No series while it does not answer.


def test_a_held_history_writes_what_collecting_every_step_writes_for_the_reliability_families() -> None:
    """`hold` repeats a quiet node's last values instead of collecting it: for the families the reliability
    report's month is written with (`months.METRICS`, which its test holds), two days of a fleet failing often
    must come out sample for sample the same."""
    families = months.METRICS
    rates = [dataclasses.replace(r, per_day=r.per_day * 2000) for r in load_rates(LLAMA3.read_text())]
    written = []
    for hold in (0.0, 6 * 3600.0):
        fleet = Fleet(2, seed=5)
        # Faults start in the first 42 hours, so that each one's XID is written well before the end.
        fleet.add(fleet.draw_faults(rates, 1.75 * DAY, 5))
        past = History(fleet, 0, families, {"cluster": "c"}, hold)
        fleet.start()
        try:
            days = [asyncio.run(past.samples(0, DAY, 300)), asyncio.run(past.samples(DAY + 300, 2 * DAY, 300))]
            written.append((days, past.collections, len(fleet.faults)))
        finally:
            fleet.close()
    (every, collected, faults), (held, fewer, _) = written
    assert faults >= 10  # Enough faults, of enough kinds, for the comparison to mean something.
    xids = "gpufleet_gpu_xid_errors_total"
    for once, twice in zip(every, held, strict=True):
        assert {k: v for k, v in once.items() if k != xids} == {k: v for k, v in twice.items() if k != xids}
    # An XID reaches the exposition through the watcher's thread, a collection sooner or later in either
    # history (across a day's end, too): the same series, ending at the same counts.
    assert (_last_values(every[0].get(xids, []) + every[1].get(xids, []))
            == _last_values(held[0].get(xids, []) + held[1].get(xids, [])))
    assert fewer < 0.75 * collected  # Faults this frequent keep the nodes collected half of the time.


def _last_values(lines: list[str]) -> dict[str, str]:
    return {series: value for series, value, _ in (line.rsplit(" ", 2) for line in lines)}
