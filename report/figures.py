"""Arithmetic on query results that PromQL cannot do for a whole range in one expression."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def quantile_from_buckets(q: float, bounds: Sequence[float], below: Sequence[float], total: float) -> float | None:
    """The q-quantile of samples in [0, 1], given how many fell below each bound (ascending).

    Linear inside a bucket, as `histogram_quantile` is; samples at or above the last bound count
    as the last bound. None when there are no samples.
    """
    if total <= 0:
        return None
    rank = q * total
    low_bound, low_count = 0.0, 0.0
    for bound, count in zip(bounds, below, strict=True):
        if count >= rank:
            if count == low_count:
                return low_bound
            return low_bound + (bound - low_bound) * (rank - low_count) / (count - low_count)
        low_bound, low_count = bound, count
    return bounds[-1]


@dataclass(frozen=True)
class Projection:
    slope_per_day: float  # Fitted change of allocated GPUs per day.
    fitted_now: float
    target: float
    days_to_target: float | None  # None: not growing towards it; 0: already there.


def project(points: Sequence[tuple[float, float]], installed: float, share: float = 0.9) -> Projection | None:
    """When a least-squares line through (unix time, allocated GPUs) reaches `share` of `installed`.

    A straight line over the whole range is the plainest reading of "at the current growth"; it
    says nothing about step changes the planner knows are coming, and the report says so.
    """
    if len(points) < 2 or installed <= 0:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / spread
    last_t = max(t for t, _ in points)
    fitted = mean_v + slope * (last_t - mean_t)
    target = share * installed
    per_day = slope * 86400
    if fitted >= target:
        days: float | None = 0.0
    elif per_day * 365 < 1:  # Less than one GPU a year: no growth worth projecting.
        days = None
    else:
        days = (target - fitted) / per_day
    return Projection(per_day, fitted, target, days)


def _poisson_cdf(k: int, mean: float) -> float:
    """P(X <= k) for X ~ Poisson(mean), summed in log space so that large means do not underflow."""
    if mean <= 0:
        return 1.0
    term = -mean  # log P(X = 0)
    total = math.exp(term)
    for i in range(1, k + 1):
        term += math.log(mean) - math.log(i)
        total += math.exp(term)
    return min(1.0, total)


def poisson_interval(count: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Garwood) interval for the mean of a Poisson count: the means under which seeing `count`
    or more, or `count` or fewer, is still as likely as the tails allow. Found by bisection on the CDF,
    so no statistics library is needed; zero events give a lower bound of 0."""
    tail = (1 - confidence) / 2

    def solve(too_low: Callable[[float], bool]) -> float:
        low, high = 0.0, count + 10 * math.sqrt(count + 1) + 10
        for _ in range(100):
            middle = (low + high) / 2
            low, high = (middle, high) if too_low(middle) else (low, middle)
        return (low + high) / 2

    lower = 0.0 if count == 0 else solve(lambda mean: 1 - _poisson_cdf(count - 1, mean) < tail)
    upper = solve(lambda mean: _poisson_cdf(count, mean) > tail)
    return lower, upper
