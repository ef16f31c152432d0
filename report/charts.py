"""PNG charts for the report, drawn with matplotlib's Agg backend: no display, no fonts to install.

Each chart is a pure function of figures the report already computed, returning PNG bytes, so the
HTML can embed it and the Markdown can link it as a file.
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # Before pyplot is imported: no display is needed or used.
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gpufleet.report.document import Chart
from gpufleet.report.figures import Projection

_COLOURS = {"installed": "#555555", "allocated": "#1f77b4", "idle": "#ff7f0e", "lost": "#d62728", "used": "#2ca02c"}


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def _day(unix_seconds: float) -> float:
    """A Unix time as matplotlib's date number, which its date axes and formatters read."""
    return float(mdates.date2num(datetime.datetime.fromtimestamp(unix_seconds, datetime.UTC)))


class UtcTicks(mdates.AutoDateFormatter):
    """Tick labels in UTC that never repeat: the shortest of a few formats under which every tick on the
    axis reads differently. A date alone ("%m-%d") repeats on every tick of a day when a two-day range is
    ticked every few hours; the time alone repeats across days; so the date stays and the time is added."""

    FORMATS = ("%m-%d", "%Y-%m-%d", "%m-%d %H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")

    def __init__(self, locator: mdates.DateLocator) -> None:
        super().__init__(locator, tz=datetime.UTC)

    def format_ticks(self, values: Sequence[float]) -> list[str]:
        days = [mdates.num2date(v, tz=datetime.UTC) for v in values]
        labels: list[str] = []
        for pattern in self.FORMATS:
            labels = [day.strftime(pattern) for day in days]
            if len(set(labels)) == len(labels):
                break
        return labels


def time_axis(axes: Axes) -> None:
    """A date axis in UTC, said so in its label, whose ticks never read the same."""
    locator = mdates.AutoDateLocator(tz=datetime.UTC, maxticks=8)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(UtcTicks(locator))
    axes.set_xlabel("UTC")
    axes.tick_params(axis="x", labelrotation=30)
    for label in axes.get_xticklabels():  # Slanted labels end under their tick.
        label.set_horizontalalignment("right")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "all"


def gpu_hours(bars: Sequence[tuple[str, float, float, float]]) -> Chart:
    """Stacked GPU-hours per cluster and model: (label, allocated, idle, lost)."""
    figure, axes = plt.subplots(figsize=(8, 0.6 * len(bars) + 2.0))
    labels = [b[0] for b in bars]
    left = [0.0] * len(bars)
    for column, state in enumerate(("allocated", "idle", "lost")):
        values = [hours[column] for _, *hours in bars]
        axes.barh(labels, values, left=left, label=state, color=_COLOURS[state])
        left = [a + b for a, b in zip(left, values, strict=True)]
    axes.set_xlabel("GPU-hours")
    axes.invert_yaxis()
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3)
    return Chart("gpu-hours", "GPU-hours by state", _png(figure))


def utilisation(histograms: dict[str, list[tuple[float, float, float]]]) -> Chart:
    """Share of allocated GPU-hours per utilisation bucket, one series per cluster and model."""
    figure, axes = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / max(1, len(histograms))
    for offset, (label, buckets) in enumerate(histograms.items()):
        centres = [i + offset * width for i in range(len(buckets))]
        axes.bar(centres, [100 * share for _, _, share in buckets], width=width, label=label)
    first = next(iter(histograms.values()), [])
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(first))],
                    [f"{low:.0%}–{high:.0%}" for low, high, _ in first], rotation=45, ha="right")
    axes.set_xlabel("GPU utilisation")
    axes.set_ylabel("% of allocated GPU-hours")
    axes.legend()
    return Chart("utilisation", "Utilisation of allocated GPU-hours", _png(figure))


def trend(cluster: str, lines: dict[str, list[tuple[float, float]]], projection: Projection | None,
          end: float) -> Chart:
    """Installed, allocated and used GPUs over time, with the fitted allocation line carried forward."""
    return Chart(f"trend-{_slug(cluster)}", f"Trend, cluster {cluster}",
                 _png(trend_figure(cluster, lines, projection, end)))


def trend_figure(cluster: str, lines: dict[str, list[tuple[float, float]]], projection: Projection | None,
                 end: float) -> Figure:
    figure, axes = plt.subplots(figsize=(8, 3.6))
    for state in ("installed", "allocated", "used", "lost"):
        points = lines.get(state)
        if points:
            axes.plot([_day(t) for t, _ in points], [v for _, v in points], label=state, color=_COLOURS[state])
    if projection is not None and projection.days_to_target:
        days = min(projection.days_to_target, 365.0)
        ahead = end + days * 86400
        axes.plot([_day(end), _day(ahead)],
                  [projection.fitted_now, projection.fitted_now + projection.slope_per_day * days],
                  linestyle="--", color=_COLOURS["allocated"], label="projected allocation")
        axes.axhline(projection.target, linestyle=":", color="#999999", label="90% of installed")
    time_axis(axes)
    axes.set_ylabel("GPUs")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Cluster {cluster}")
    axes.legend(loc="lower left", fontsize="small")
    return figure


def mtti(sizes: Sequence[int], hours: Sequence[float | None], low: Sequence[float], high: Sequence[float | None],
         published: Sequence[tuple[str, Sequence[tuple[int, float]]]]) -> Chart:
    """Mean time to interruption against job size, on log axes, with its 95% band and published points.

    `hours` is None where no interruption was seen (the mean is unbounded); the band's `high` then too,
    and only the lower edge, what the fleet's record still guarantees, is drawn.
    """
    figure, axes = plt.subplots(figsize=(8, 4.2))
    seen = [(n, h) for n, h in zip(sizes, hours, strict=True) if h is not None]
    if seen:
        axes.plot([n for n, _ in seen], [h for _, h in seen], marker="o", color=_COLOURS["allocated"],
                  label="this fleet")
    bounded = [(n, lo, hi) for n, lo, hi in zip(sizes, low, high, strict=True) if hi is not None]
    if bounded:
        axes.fill_between([n for n, _, _ in bounded], [lo for _, lo, _ in bounded], [hi for _, _, hi in bounded],
                          color=_COLOURS["allocated"], alpha=0.15, label="95% interval")
    else:
        axes.plot(sizes, low, linestyle="--", color=_COLOURS["allocated"], label="at least (95%)")
    for (name, points), marker, colour in zip(published, "sD^v", ("#d62728", "#9467bd", "#8c564b"), strict=False):
        axes.scatter([n for n, _ in points], [h for _, h in points], marker=marker, color=colour, zorder=3, label=name)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("GPUs in the job")
    axes.set_ylabel("hours between interruptions")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize="small")
    return Chart("mtti", "Mean time to interruption by job size", _png(figure))
