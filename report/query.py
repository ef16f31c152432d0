"""The report's window onto Prometheus: one time range, one step, and each distinct query asked once.

Every figure over the range is an instant query at its end, over the recorded series of the
`gpufleet-capacity-*` rule groups: a subquery `[range:step]` where a figure is a sum over time (so a
30-day range at 30 minutes is 1,440 points a series), a raw range where every evaluation counts (a
peak, a p95). Sections that need the same expression share one request.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpufleet import duration
from gpufleet.alerts import capacity
from gpufleet.alerts.config import Config
from gpufleet.report.prometheus import Prometheus, Series

POINTS_PER_SERIES = 1440
# The capacity rules' interval: a finer step reads the same evaluation again.
MIN_STEP = int(duration.parse(capacity.INTERVAL))


def choose_step(range_seconds: float, requested: float | None = None) -> int:
    """Whole minutes, at least 5, and few enough points that a 30-day range costs 1,440 per series."""
    if requested is not None:
        return max(60, int(requested) // 60 * 60)
    return max(MIN_STEP, math.ceil(range_seconds / POINTS_PER_SERIES / 60) * 60)


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    step: int

    @classmethod
    def ending(cls, end: float, length: float, step: int) -> Window:
        """Aligned to the step, so a subquery's points fall exactly `length / step` times in the range."""
        aligned = math.floor(end / step) * step
        points = max(1, round(length / step))
        return cls(aligned - points * step, aligned, step)

    @property
    def seconds(self) -> int:
        return int(self.end - self.start)

    @property
    def r(self) -> str:
        return f"{self.seconds}s"

    @property
    def s(self) -> str:
        return f"{self.step}s"

    @property
    def hours_per_point(self) -> float:
        return self.step / 3600

    def over(self, expr: str) -> str:
        """A subquery with exactly `seconds / step` points: its range stops half a step short of the start,
        which no point falls on, so it does not matter whether this Prometheus includes a range's left edge
        (2.x does, 3.x does not)."""
        return f"({expr})[{self.seconds - self.step // 2}s:{self.s}]"


@dataclass
class Queries:
    """Each distinct query asked once. Series come back with the configured cluster label as `cluster`, so
    sections read one name whatever the scrape configuration calls it."""

    prometheus: Prometheus
    window: Window
    on_done: Callable[[], None] = lambda: None
    config: Config = field(default_factory=Config)
    _asked: dict[tuple[str, str, int], asyncio.Task[list[Series]]] = field(default_factory=dict)

    def by(self, *labels: str) -> str:
        return self.config.by(*labels)

    def _once(self, key: tuple[str, str, int],
              make: Callable[[], Awaitable[list[Series]]]) -> asyncio.Task[list[Series]]:
        if key not in self._asked:
            self._asked[key] = asyncio.ensure_future(self._counted(make()))
        return self._asked[key]

    async def _counted(self, pending: Awaitable[list[Series]]) -> list[Series]:
        try:
            result = await pending
        finally:
            self.on_done()
        label = self.config.cluster_label
        if label == "cluster":
            return result
        return [Series({("cluster" if k == label else k): v for k, v in s.labels.items()}, s.values) for s in result]

    async def at_end(self, expr: str) -> list[Series]:
        return await self._once(("instant", expr, 0), lambda: self.prometheus.instant(expr, self.window.end))

    async def samples(self, selector: str) -> list[Series]:
        """Every sample of a (sparse) series in the range, at its own time."""
        return await self._once(("samples", selector, 0),
                                lambda: self.prometheus.samples(f"{selector}[{self.window.r}]", self.window.end))

    async def over_range(self, expr: str, step: int) -> list[Series]:
        w = self.window
        return await self._once(("range", expr, step), lambda: self.prometheus.range(expr, w.start + step, w.end, step))
