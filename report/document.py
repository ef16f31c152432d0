"""The report as data: sections of tables and charts that the HTML and Markdown writers both render.

Keeping content apart from format is what makes the two outputs agree: a figure is computed and
formatted once, and each writer only lays it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Table:
    caption: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    empty: str = "None in this period."


@dataclass(frozen=True)
class Chart:
    name: str  # File stem, unique in the report.
    title: str
    png: bytes


@dataclass
class Section:
    key: str
    title: str
    about: str
    findings: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)


@dataclass(frozen=True)
class Failure:
    """A section that could not be computed, and why, in words the reader can act on."""

    title: str
    reason: str


@dataclass
class Report:
    title: str
    period: str
    source: str
    generated: str
    method: list[str]
    sections: list[Section] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
