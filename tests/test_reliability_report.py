"""`gpufleet report reliability` over a simulated month of a fleet failing at Llama 3's rates.

Two nodes of 8 GPUs run one Slurm job for 31 days while faults are drawn from the shipped Llama 3
profile (simulator/fault-rates/llama3.yml), every rate multiplied by `SCALE` so that a month of 16
GPUs sees about ninety interruptions instead of a fifth of one. The history is imported into a real
Prometheus, the committed reliability and capacity groups are evaluated over the last 30 days with
promtool, and the report must find, for every cause class, a rate whose 95% interval holds the rate
the profile asked for, and the same for all causes together.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import cli as gpufleet_cli
from gpufleet.alerts import reliability as rules
from gpufleet.devtools.months import Month, asked_per_gpu_day, jobs, month
from gpufleet.devtools.net import free_port
from gpufleet.devtools.tables import interval, markdown_tables, number, rows
from gpufleet.simulator.fleet import Fleet

from layouts import nodes
from reports import HtmlTables, drawn, opened_in_chromium

H, DAY = 3600, 86400
DAYS = 30
SCALE = 400
SEED = 3  # A month whose draw of every class lies in its Poisson 95% interval, as most seeds' do.


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Month]:
    """Two nodes running one job for the month; a quiet node's values are held for up to six hours, as the bench
    holds them, which test_fault_rates proves exact for every family the month is written with."""
    with month(tmp_path_factory.mktemp("month"), Fleet(2, seed=SEED, layout=jobs(2, 2)), DAYS, SCALE, SEED,
               6 * H) as held:
        yield held


def _report(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> tuple[int, str]:
    code = gpufleet_cli.main(["report", "reliability", "--out", str(out), *args])
    return code, capsys.readouterr().err


@pytest.fixture
def report(simulated: Month, tmp_path_factory, capsys) -> Path:
    url, end = simulated.url, simulated.end
    out = tmp_path_factory.getbasetemp() / "reliability-report"
    if not (out / "reliability-report.md").exists():
        code, err = _report(capsys, out, "--prometheus", url, "--range", f"{DAYS}d", "--end", str(end))
        assert code == 0, err
        assert "not computed" not in err, err
    return out


@pytest.mark.slow
@pytest.mark.e2e
def test_each_cause_is_found_at_the_rate_the_profile_asked_for(simulated: Month, report: Path) -> None:
    tables = markdown_tables((report / "reliability-report.md").read_text())
    found = {row["Cause"]: row for row in rows(tables, "Interruptions by cause")}
    asked = asked_per_gpu_day(SCALE)
    started = simulated.started
    for key, title in rules.CLASSES.items():
        low, high = interval(found[title]["95% interval"])
        assert low <= 1000 * asked[key] <= high, (title, found[title], 1000 * asked[key])
        # Every fault the simulator started is counted once, but for the few a down node hid, or a second
        # fault on the same GPU within an interval of the first.
        assert 0.85 * started[key] - 1 <= int(found[title]["Interruptions"]) <= started[key], (title, started)
    low, high = interval(found["All causes"]["95% interval"])
    assert low <= 1000 * sum(asked.values()) <= high, (found["All causes"], 1000 * sum(asked.values()))
    assert int(found["All causes"]["Interruptions"]) > 50  # Enough for the intervals to mean something.
    assert found["NVLink"]["Interruptions"] == "0"  # The profile maps nothing to NVLink.


@pytest.mark.slow
@pytest.mark.e2e
def test_jobs_repeats_and_the_time_to_interruption_agree_with_the_counts(report: Path) -> None:
    tables = markdown_tables((report / "reliability-report.md").read_text())
    total = int(next(r for r in rows(tables, "Interruptions by cause") if r["Cause"] == "All causes")["Interruptions"])
    # One job on both nodes all month: every interruption hit it, and it ran 16 GPUs for the 30 days.
    [job] = rows(tables, "Jobs hit")
    assert job["Job"] == "slurm 777" and int(job["Interruptions"]) == total
    assert number(job["GPU-hours in the period"]) == pytest.approx(16 * DAYS * 24, rel=0.05)
    for gpu in rows(tables, "GPUs interrupted twice or more"):
        assert int(gpu["Interruptions"]) >= 2 and gpu["Node"] in nodes(1, 2)
    mtti = {row["GPUs in the job"]: row for row in rows(tables, "Mean time to interruption")}
    # 16 GPUs observed for about 30 days (less the hours a node was down): 16 x 720 GPU-hours at most.
    assert 1 / (16384 * total / (16 * DAYS * 24)) <= _hours(mtti["16,384"]["Mean time"]) * 1.06
    assert _hours(mtti["8"]["Mean time"]) == pytest.approx(2048 * _hours(mtti["16,384"]["Mean time"]), rel=0.01)
    assert "Meta research clusters (2025): 1.8 h" in mtti["16,384"]["Published"]


def _hours(cell: str) -> float:
    value, unit = cell.split(" ")
    return number(value) * {"days": 24, "h": 1, "min": 1 / 60, "s": 1 / 3600}[unit]


@pytest.mark.slow
@pytest.mark.e2e
def test_html_holds_the_markdowns_tables_and_opens_in_chromium_with_its_chart(report: Path, tmp_path: Path) -> None:
    parser = HtmlTables()
    parser.feed((report / "reliability-report.html").read_text())
    assert parser.tables == markdown_tables((report / "reliability-report.md").read_text())
    probe = opened_in_chromium(report / "reliability-report.html", tmp_path)
    assert probe["errors"] == [] and probe["tables"] >= 5
    [(complete, width, height)] = probe["images"]  # The time-to-interruption chart.
    assert complete and width >= 600 and height >= 250
    assert drawn(report / "charts" / "mtti.png")


@pytest.mark.slow
@pytest.mark.e2e
def test_before_the_rules_were_loaded_the_report_says_what_is_missing(simulated: Month, tmp_path, capsys) -> None:
    url, end = simulated.url, simulated.end
    code, err = _report(capsys, tmp_path, "--prometheus", url, "--range", "12h", "--end", str(end - DAYS * DAY - H))
    assert code == 1, err
    assert ("Interruptions by cause: no samples of cluster:gpufleet_observed_units:count in the range (recorded by "
            "the rule group gpufleet-reliability in alerts/gpufleet-rules.yml") in err
    assert "no section could be computed; nothing written" in err and not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.e2e
def test_a_range_without_data_computes_nothing(simulated: Month, tmp_path, capsys) -> None:
    url, end = simulated.url, simulated.end
    code, err = _report(capsys, tmp_path, "--prometheus", url, "--range", "7d", "--end", str(end - 60 * DAY))
    assert code == 1 and "no gpufleet GPU metrics" in err
    assert not list(tmp_path.iterdir())


def test_unreachable_prometheus_is_an_error(tmp_path, capsys) -> None:
    code, err = _report(capsys, tmp_path, "--prometheus", f"http://127.0.0.1:{free_port()}", "--range", "30d")
    assert code == 2 and "cannot connect to Prometheus at http://127.0.0.1:" in err
    assert not list(tmp_path.iterdir())
