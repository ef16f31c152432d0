"""Readers for the tables the reports write in Markdown, for the tests and benchmarks that check them."""

from __future__ import annotations

import re


def markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Caption (the bold line above a table) -> rows of cells, header first."""
    tables: dict[str, list[list[str]]] = {}
    caption = None
    for line in text.splitlines():
        if line.startswith("**") and line.endswith("**"):
            caption = line.strip("*")
        elif line.startswith("| ") and caption is not None:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            tables.setdefault(caption, []).append(cells)
    return tables


def rows(tables: dict[str, list[list[str]]], caption: str) -> list[dict[str, str]]:
    """The rows of one table as dicts keyed by its header."""
    header, *body = tables[caption]
    return [dict(zip(header, row, strict=True)) for row in body]


def number(cell: str) -> float:
    """A cell's number, without its thousands separators and unit."""
    return float(cell.replace(",", "").removesuffix("%").removesuffix(" W").removesuffix(" kW"))


def interval(cell: str) -> tuple[float, float]:
    """The bounds of a cell that gives an interval as two numbers joined by an en dash."""
    low, high = cell.split("\N{EN DASH}")
    return number(low), number(high)
