"""What a report is made of, shared by every report: its sections, what each needs, and how it is described.

`gpufleet report capacity` and `gpufleet report reliability` differ only in these specs; running them,
handling a Prometheus that fails, and writing HTML and Markdown are one code path (run.py, cli.py,
render.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpufleet.alerts.config import Config
from gpufleet.report.document import Section
from gpufleet.report.query import Queries, Window


class SectionError(Exception):
    """A section cannot say anything true about this range; the message says why."""


@dataclass(frozen=True)
class SectionSpec:
    key: str
    title: str
    requires: tuple[str, ...]  # Metric names; "a|b" is satisfied by either.
    build: Callable[[Queries], Awaitable[Section]]


@dataclass(frozen=True)
class ReportSpec:
    name: str  # The subcommand, and the stem of the files written: capacity-report.html.
    title: str
    sections: Sequence[SectionSpec]
    method: Callable[[Window, Config], list[str]]  # How the figures were computed, for the report's end.


def cluster_note(config: Config) -> str:
    """The method's line on clusters, which every report's figures are split by."""
    return f"Clusters are the `{config.cluster_label}` label of the scraped series; \u2014 means the series have none."
