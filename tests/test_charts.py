"""The reports' time axes: ticks in UTC, said on the axis, and never two that read the same.

A two-day capacity chart once labelled four ticks in a row `11-21`: a date-only format on an axis
ticked every few hours. These draw the trend chart as the report does, over ranges from an hour to
more than a year, and read the labels matplotlib would print.
"""

from __future__ import annotations

import datetime
import time

import pytest
from matplotlib import pyplot as plt

from gpufleet.report import charts
from gpufleet.report.figures import Projection

END = datetime.datetime(2026, 11, 22, 18, 0, tzinfo=datetime.UTC).timestamp()
HOUR = 3600.0


def labels(span_hours: float, projection: Projection | None = None) -> tuple[list[str], str]:
    start = END - span_hours * HOUR
    points = [(start + i * (END - start) / 200, 100.0 + i) for i in range(201)]
    figure = charts.trend_figure("a", {"installed": points, "allocated": points}, projection, END)
    try:
        figure.canvas.draw()
        [axes] = figure.axes
        return [label.get_text() for label in axes.get_xticklabels()], axes.get_xlabel()
    finally:
        plt.close(figure)


@pytest.mark.parametrize("span_hours", [1, 6, 30, 48, 24 * 7, 24 * 30, 24 * 400])
def test_no_two_ticks_read_the_same(span_hours: float) -> None:
    ticks, axis = labels(span_hours)
    assert len(ticks) >= 3, ticks
    assert len(set(ticks)) == len(ticks), ticks
    assert "UTC" in axis


def test_two_days_name_the_hour_and_the_day() -> None:
    ticks, _ = labels(48)
    assert any(tick.startswith("11-21 ") for tick in ticks) and any(tick.startswith("11-22 ") for tick in ticks)
    assert len({tick.split(" ")[0] for tick in ticks}) < len(ticks)  # A day has several ticks, told apart by hour.


def test_ticks_are_in_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: a local date would read a day later.
    time.tzset()
    try:
        ticks, _ = labels(48)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert ticks[-1].startswith("11-22")


def test_a_projection_a_year_ahead_keeps_the_ticks_apart() -> None:
    growing = Projection(slope_per_day=0.5, fitted_now=300.0, target=900.0, days_to_target=1200.0)
    ticks, _ = labels(24 * 30, growing)
    assert len(set(ticks)) == len(ticks), ticks
    assert any(tick.startswith("2027") for tick in ticks)  # Across a new year the year is printed.
