"""Text exposition of metric families, in the Prometheus text format 0.0.4."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Families:
    """The registry interface `generate_latest` expects, over families already collected."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(families: Sequence[Metric]) -> bytes:
    return generate_latest(_Families(families)) if families else b""  # type: ignore[arg-type]
