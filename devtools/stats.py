"""The one percentile the benchmarks and tests report."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], share: float) -> float:
    """The `share` quantile (0 to 1) of `values`, interpolated linearly between the closest ranks (NumPy's
    default, and `statistics.quantiles(method="inclusive")` at whole percents); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = share * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
