"""`gpufleet report capacity` against a real Prometheus holding two days of simulated fleet history.

The history is written by the simulator for past timestamps and imported with `promtool tsdb
create-blocks-from openmetrics`; the committed `gpufleet-capacity-*` rules are then evaluated over it
with `promtool tsdb create-blocks-from rules`, as Prometheus would have recorded them, so every
figure can be checked against what the simulator was told: 8 nodes of 8 GPUs, two of them idle
throughout (25% of GPU-hours), and a known list of faults.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml

from gpufleet import cli as gpufleet_cli
from gpufleet.alerts.capacity import capacity
from gpufleet.alerts.config import Config
from gpufleet.devtools.backfill import backfill, recorded
from gpufleet.devtools.net import free_port, http
from gpufleet.devtools.tables import markdown_tables, number, rows
from gpufleet.report.figures import project, quantile_from_buckets
from gpufleet.simulator.faults import Fault
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.layout import Job
from gpufleet.simulator.node_sysfs import NODE_HOST_WATTS
from gpufleet.simulator.workload import COMM, COMPUTE

from layouts import nodes
from reports import HtmlTables, drawn, opened_in_chromium

H = 3600
STEP = 300  # The capacity rules' interval: the history holds a sample at every evaluation.
GROUPS = tuple(group["name"] for group in capacity(Config()))
DAYS = 2
METRICS = re.compile(
    r"gpufleet_gpu_(info|up|job_info|utilization_ratio|sm_active_ratio|tensor_active_ratio|memory_(free|total)_bytes|power_watts|power_limit_watts"
    r"|energy_joules_total|xid_errors_total|ecc_errors_total|row_remap_(pending|failed)|clock_hertz|devices"
    r"|pci_devices)|gpufleet_infiniband_(port_(xmit|rcv)_data_bytes_total|rate_bytes_per_second)"
    r"|gpufleet_network_((transmit|receive)_bytes_total|speed_bytes_per_second)|gpufleet_hwmon_power_watts")
# The jobs every figure below rests on: one of four nodes and two of one each; nodes 3 and 4 idle.
LAYOUT = [Job("169486", "slurm", nodes(6), 37.0, 0.25, 0.9),
          Job("446135", "slurm", nodes(1, 2, 7, 8), 56.0, 0.22, 0.69),
          Job("311430", "slurm", nodes(5), 29.0, 0.22, 0.74)]
FAULTS = [
    Fault("slow", "straggler", "gpu-node-0001", 20 * H, 6 * H),
    Fault("xid31", "xid", "gpu-node-0006", 10 * H, gpu=0, xid=31),
    Fault("lost", "gpu_lost", "gpu-node-0002", 30 * H, 2 * H, gpu=3),
    Fault("dbe", "ecc_dbe", "gpu-node-0007", 5 * H, gpu=1),
    Fault("remap", "row_remap_pending", "gpu-node-0008", 40 * H, 3 * H, gpu=2),
    Fault("busy", "nic_saturation", "gpu-node-0005", 12 * H, 12 * H, port="mlx5_0/1", direction="tx"),
]


@pytest.fixture(scope="module")
def fleet_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    tmp = tmp_path_factory.mktemp("history")
    end = math.floor(time.time() / STEP) * STEP - STEP
    fleet = Fleet(8, seed=0, layout=LAYOUT)
    fleet.add(FAULTS)
    data, _ = backfill(tmp, fleet, end - DAYS * 86400, end, STEP, METRICS)
    with recorded(tmp, data, end - DAYS * 86400, end, GROUPS) as url:
        yield url, end


def _report(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> tuple[int, str]:
    code = gpufleet_cli.main(["report", "capacity", "--out", str(out), *args])
    return code, capsys.readouterr().err


@pytest.fixture
def report(fleet_prometheus, tmp_path_factory, capsys) -> tuple[Path, str]:
    """The report over the whole history, written once for the module's tests."""
    url, end = fleet_prometheus
    out = tmp_path_factory.getbasetemp() / "capacity-report"
    if not (out / "capacity-report.md").exists():
        code, err = _report(capsys, out, "--prometheus", url, "--range", f"{DAYS}d", "--step", f"{STEP}s",
                            "--end", str(end), "--progress")
        assert code == 0, err
        (out / "stderr.txt").write_text(err)
    return out, (out / "stderr.txt").read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_figures_match_what_the_simulator_was_told(report: tuple[Path, str]) -> None:
    out, err = report
    tables = markdown_tables((out / "capacity-report.md").read_text())
    assert "Sections not computed" not in (out / "capacity-report.md").read_text()
    hours = DAYS * 24

    [inventory] = rows(tables, "GPUs by cluster and model")
    assert (inventory["Cluster"], inventory["Model"]) == ("test", "NVIDIA H100 80GB HBM3")
    assert (inventory["Installed"], inventory["Healthy"], inventory["Lost"]) == ("64", "64", "0")
    assert number(inventory["GPU-hours installed"]) == pytest.approx(64 * hours, rel=0.01)
    assert number(inventory["GPU-hours lost"]) == pytest.approx(2.0, abs=STEP / H)

    [allocation] = rows(tables, "GPU-hours by cluster and model")
    assert number(allocation["Idle share"]) == pytest.approx(25.0, abs=1.0)
    assert number(allocation["Idle"]) == pytest.approx(16 * hours, rel=0.01)
    assert number(allocation["Allocated"]) == pytest.approx(48 * hours - 2, rel=0.01)

    [power] = rows(tables, "Energy and power by cluster and model")
    # The energy counter and the power gauge are separate series: they must tell the same story.
    assert number(power["Energy (kWh)"]) == pytest.approx(
        number(power["Mean power per GPU"]) * 64 * hours / 1000, rel=0.02)
    # Every simulated node has its own meter: its boards plus a host that draws at least NODE_HOST_WATTS.
    [node] = rows(tables, "Node power, where the node meters it")
    assert node["Nodes metered"] == "8 of 8"
    node_watts, gpus_watts = 1000 * number(node["Mean power per node"]), 8 * number(power["Mean power per GPU"])
    assert number(node["Energy (kWh)"]) == pytest.approx(node_watts * 8 * hours / 1000, rel=0.02)
    assert node_watts - gpus_watts >= NODE_HOST_WATTS
    assert number(node["GPUs' share"]) == pytest.approx(100 * gpus_watts / node_watts, abs=0.5)

    problems = {(r["Node"], r["GPU"]): r for r in rows(tables, "GPUs with health problems")}
    assert set(problems) == {("gpu-node-0006", "0"), ("gpu-node-0002", "3"), ("gpu-node-0007", "1"),
                             ("gpu-node-0008", "2")}
    assert problems[("gpu-node-0006", "0")]["XIDs (code ×count)"] == "31 ×1"
    assert problems[("gpu-node-0007", "1")]["Uncorrectable ECC"] == "1"
    assert problems[("gpu-node-0008", "2")]["Row remap"] == "pending"
    assert number(problems[("gpu-node-0002", "3")]["Hours lost"]) == pytest.approx(2.0, abs=STEP / H)

    [straggler] = rows(tables, "Straggling nodes")
    assert straggler["Node"] == "gpu-node-0001"
    assert number(straggler["Hours straggling"]) == pytest.approx(6.0, abs=2 * STEP / H)

    [busiest, *_] = rows(tables, "Busiest links")
    assert (busiest["Node"], busiest["Port"], busiest["Direction"]) == ("gpu-node-0005", "mlx5_0/1", "transmit")
    assert number(busiest["Peak"]) >= 90  # 97% of line rate, averaged over 10-minute windows.

    jobs = rows(tables, "Top 20 jobs")
    assert [(j["Most GPUs"], j["Most nodes"]) for j in jobs] == [("32", "4"), ("8", "1"), ("8", "1")]
    assert number(jobs[0]["GPU-hours"]) == pytest.approx(32 * hours - 2, rel=0.01)

    [trend] = rows(tables, "Projection by cluster")
    assert trend["Reaches it"] == "not at the current growth"  # The layout does not change over the history.
    # The progress bar, redrawn as queries finish (capsys reads its carriage returns as newlines).
    assert re.search(r"^\[-{30}\] 0/10 sections, 1 queries$", err, re.M), err
    assert re.search(r"^\[#{30}\] 10/10 sections, \d+ queries$", err, re.M), err


@pytest.mark.slow
@pytest.mark.e2e
def test_utilisation_agrees_with_the_raw_samples(fleet_prometheus, report) -> None:
    """The bucketed quantiles against exact ones from every allocated GPU's samples."""
    url, end = fleet_prometheus
    query = ("gpufleet_gpu_utilization_ratio and on (cluster, instance, gpu) gpufleet_gpu_job_info")
    params = urllib.parse.urlencode({"query": query, "start": end - DAYS * 86400 + STEP, "end": end, "step": STEP})
    status, body = http("GET", f"{url}/api/v1/query_range?{params}")
    assert status == 200, body
    values = sorted(float(v) for s in json.loads(body)["data"]["result"] for _, v in s["values"])
    assert len(values) == pytest.approx(48 * DAYS * 86400 / STEP, rel=0.01)
    [row] = rows(markdown_tables((report[0] / "capacity-report.md").read_text()), "Utilisation by cluster and model")
    assert number(row["Mean"]) == pytest.approx(100 * sum(values) / len(values), abs=0.1)
    for column, q in (("p50", 0.5), ("p95", 0.95)):
        assert number(row[column]) == pytest.approx(100 * values[int(q * (len(values) - 1))], abs=5.0)
    assert number(row["Below 10%"]) == pytest.approx(100 * sum(v < 0.1 for v in values) / len(values), abs=0.1)


def tensor_share(job: Job, slowdown: float = 0.0, own: float = 0.0) -> float:
    """The tensor pipes' share of one of `job`'s steps, stretched by `slowdown`; `own` of it the node's own."""
    period = job.period * (1 + slowdown)
    computing = job.period * (1 - job.comm_fraction) + own * job.period
    return (computing * COMPUTE.tensor + job.period * job.comm_fraction * COMM.tensor) / period


@pytest.mark.slow
@pytest.mark.e2e
def test_busy_and_doing_math_follow_the_workload(report) -> None:
    """Every simulated board has GPM: its allocated hours are all measured, and the tensor pipes work in the
    compute phases only, so they are busy less than NVML's utilisation, which collectives keep high."""
    tables = markdown_tables((report[0] / "capacity-report.md").read_text())
    [row] = rows(tables, "Busy and doing math, allocated GPUs with GPM")
    [allocation] = rows(tables, "GPU-hours by cluster and model")
    assert number(row["GPU-hours with GPM"]) == pytest.approx(number(allocation["Allocated"]), rel=0.01)
    # GPM drops each GPU's first interval: the history's first step for the 48 allocated GPUs, and one more for
    # the GPU that came back from falling off the bus.
    assert number(row["GPU-hours without GPM (not counted)"]) == pytest.approx(49 * STEP / H, abs=STEP / H)
    healthy = sum(len(job.nodes) * tensor_share(job) for job in LAYOUT) / 6
    # Job 446135's four nodes wait for the 40 % straggler for 6 of the 48 hours: three peers, and itself.
    slowed = (3 * tensor_share(LAYOUT[1], 0.4) + tensor_share(LAYOUT[1], 0.4, own=0.4)) / 4
    expected = healthy - 4 / 6 * 6 / 48 * (tensor_share(LAYOUT[1]) - slowed)
    assert number(row["Tensor active"]) == pytest.approx(100 * expected, abs=1.0)
    assert number(row["NVML utilisation"]) > number(row["SM active"]) > number(row["Tensor active"])


@pytest.mark.slow
@pytest.mark.e2e
def test_markdown_and_html_hold_the_same_tables(report) -> None:
    out, _ = report
    parser = HtmlTables()
    parser.feed((out / "capacity-report.html").read_text())
    markdown = markdown_tables((out / "capacity-report.md").read_text())
    assert len(parser.tables) >= 10
    assert parser.tables == markdown
    empty = "Nodes where NVML missed GPUs on the PCI bus:"  # No such node in the history: a line, not a table.
    assert f"<strong>{empty}</strong> None in this period." in (out / "capacity-report.html").read_text()
    assert f"**{empty}** None in this period." in (out / "capacity-report.md").read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_html_opens_in_headless_chromium_with_real_charts(report, tmp_path: Path) -> None:
    out, _ = report
    probe = opened_in_chromium(out / "capacity-report.html", tmp_path)
    assert probe["errors"] == []
    assert probe["tables"] >= 10
    assert len(probe["images"]) == 3  # GPU-hours, utilisation, and the one cluster's trend.
    for complete, width, height in probe["images"]:
        assert complete and width >= 600 and height >= 250
    for png in (out / "charts").glob("*.png"):
        assert drawn(png), png


@pytest.fixture(scope="module")
def partial_prometheus(tmp_path_factory) -> Iterator[tuple[str, float, Path]]:
    """Six hours of GPU inventory only, behind basic auth: most sections cannot be computed. The capacity
    rules were loaded three hours in: the hours before have raw series and nothing recorded."""
    tmp = tmp_path_factory.mktemp("partial")
    end = math.floor(time.time() / STEP) * STEP - STEP
    data, _ = backfill(tmp, Fleet(2, seed=1), end - 6 * H, end, STEP, re.compile(r"gpufleet_gpu_(info|up)"))
    web = tmp / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {
        "planner": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()}}))
    (tmp / "password").write_text("s3cret\n")
    (tmp / "wrong").write_text("guess\n")
    with recorded(tmp, data, end - 3 * H, end, GROUPS, web_config=web) as url:
        yield url, end, tmp


@pytest.mark.slow
@pytest.mark.e2e
def test_missing_metrics_name_the_sections_that_failed(partial_prometheus, tmp_path, capsys) -> None:
    url, end, secrets = partial_prometheus
    login = ("--prometheus.username", "planner", "--prometheus.password-file", str(secrets / "password"))
    code, err = _report(capsys, tmp_path, "--prometheus", url, "--range", "6h", "--end", str(end), *login)
    assert code == 0, err
    text = (tmp_path / "capacity-report.md").read_text()
    [inventory] = rows(markdown_tables(text), "GPUs by cluster and model")
    assert inventory["Installed"] == "16"
    assert number(inventory["GPU-hours installed"]) == pytest.approx(16 * 3, abs=16 * STEP / H)  # Recorded hours.
    assert ("not computed: Network links: no samples of instance_port:gpufleet_link_utilization:ratio_rate10m in "
            "the range (recorded by the rule group gpufleet-capacity-links in alerts/gpufleet-rules.yml") in err
    assert "- Top jobs by GPU-hours: no samples of cluster_job:gpufleet_gpus:count in the range" in text
    assert "## Inventory" in text and "## Top jobs by GPU-hours" not in text

    # Before the rules were loaded there are raw series and nothing the report reads: it says so, and fails.
    code, err = _report(capsys, tmp_path / "early", "--prometheus", url, "--range", "2h", "--end",
                        str(end - 4 * H), *login)
    assert code == 1, err
    assert "Inventory: no samples of cluster_name:gpufleet_gpus:count in the range (recorded by" in err


@pytest.mark.slow
@pytest.mark.e2e
def test_refused_credentials_are_an_error(partial_prometheus, tmp_path, capsys) -> None:
    url, end, secrets = partial_prometheus
    code, err = _report(capsys, tmp_path, "--prometheus", url, "--range", "6h", "--end", str(end),
                        "--prometheus.username", "planner", "--prometheus.password-file", str(secrets / "wrong"))
    assert code == 2 and "refused the credentials (HTTP 401)" in err
    assert not (tmp_path / "capacity-report.html").exists()


def test_unreachable_prometheus_is_an_error(tmp_path, capsys) -> None:
    code, err = _report(capsys, tmp_path, "--prometheus", f"http://127.0.0.1:{free_port()}", "--range", "1d")
    assert code == 2 and "cannot connect to Prometheus at http://127.0.0.1:" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.e2e
def test_a_range_without_data_computes_nothing(fleet_prometheus, tmp_path, capsys) -> None:
    url, end = fleet_prometheus
    code, err = _report(capsys, tmp_path, "--prometheus", url, "--range", "7d", "--end", str(end - 30 * 86400))
    assert code == 1 and "no gpufleet GPU metrics" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "message"), [
    (["--range", "soon"], "invalid duration 'soon'"),
    (["--end", "2026-11-01T00:00:00"], "needs a zone"),
    (["--range", "1h", "--step", "2h"], "is longer than --range"),
    (["--prometheus.password-file", "/nonexistent/pw"], "cannot read /nonexistent/pw"),
])
def test_bad_flags_say_what_is_wrong(args, message, tmp_path, capsys) -> None:
    try:
        code = gpufleet_cli.main(["report", "capacity", "--prometheus", "http://127.0.0.1:1", "--out", str(tmp_path),
                              *args])
    except SystemExit as exit:
        code = exit.code
    assert code == 2 and message in capsys.readouterr().err


def test_quantiles_interpolate_inside_a_bucket() -> None:
    bounds = (0.25, 0.5, 0.75, 1.0)
    assert quantile_from_buckets(0.5, bounds, (10, 50, 90, 100), 100) == pytest.approx(0.5)
    assert quantile_from_buckets(0.3, bounds, (10, 50, 90, 100), 100) == pytest.approx(0.25 + 0.25 * 20 / 40)
    assert quantile_from_buckets(0.99, bounds, (0, 0, 0, 0), 100) == 1.0  # All samples at exactly 100%.
    assert quantile_from_buckets(0.5, bounds, (0, 0, 0, 0), 0) is None


def test_projection_reaches_ninety_percent_on_the_fitted_line() -> None:
    day = 86400.0
    growing = [(i * day, 50 + 2 * i) for i in range(10)]  # 2 GPUs a day, at 68 on day 9.
    projection = project(growing, installed=100)
    assert projection.slope_per_day == pytest.approx(2.0)
    assert projection.days_to_target == pytest.approx((90 - 68) / 2)
    assert project([(i * day, 95.0) for i in range(5)], installed=100).days_to_target == 0
    assert project([(i * day, 60 - i) for i in range(5)], installed=100).days_to_target is None
    assert project([(0.0, 1.0)], installed=100) is None
