"""The report as one self-contained HTML file (charts inlined) and as Markdown (charts beside it).

An HTML file that needs nothing else survives being attached to an email; Markdown pastes into a
wiki or a ticket. Both walk the same `Report`, so their tables hold the same cells.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from gpufleet.report.document import Report, Table

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding-bottom: .3em; }
.failed { background: #fff4e5; border: 1px solid #f0b36b; padding: .6em 1em; }
.meta { color: #555; } img { max-width: 100%; display: block; margin: .5em 0; }
"""


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "+-") and cell[-1] not in ")"


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    if not table.rows:
        return f"<p><strong>{html.escape(table.caption)}:</strong> {html.escape(table.empty)}</p>"
    body = "".join("<tr>" + "".join(f'<td{" class=n" if _numeric(c) else ""}>{html.escape(c)}</td>' for c in row)
                   + "</tr>" for row in table.rows)
    return f"<table><caption>{html.escape(table.caption)}</caption><tr>{head}</tr>{body}</table>"


def to_html(report: Report) -> str:
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(report.title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(report.title)}</h1>",
             f"<p class=meta>{html.escape(report.period)}<br>Source: {html.escape(report.source)}<br>"
             f"Generated {html.escape(report.generated)}</p>"]
    if report.failures:
        parts.append("<div class=failed><strong>Sections not computed</strong><ul>"
                     + "".join(f"<li>{html.escape(f.title)}: {html.escape(f.reason)}</li>" for f in report.failures)
                     + "</ul></div>")
    parts.append("<ul>" + "".join(f'<li><a href="#{s.key}">{html.escape(s.title)}</a></li>' for s in report.sections)
                 + "</ul>")
    for section in report.sections:
        parts.append(f'<h2 id="{section.key}">{html.escape(section.title)}</h2><p>{html.escape(section.about)}</p>')
        parts.extend(f"<p><strong>{html.escape(f)}</strong></p>" for f in section.findings)
        parts.extend(_html_table(t) for t in section.tables)
        for chart in section.charts:
            data = base64.b64encode(chart.png).decode()
            parts.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(chart.title)}">')
    parts.append("<h2>Method</h2><ul>" + "".join(f"<li>{html.escape(m)}</li>" for m in report.method) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _md_table(table: Table) -> list[str]:
    if not table.rows:
        return [f"**{table.caption}:** {table.empty}", ""]
    lines = [f"**{table.caption}**", "", "| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
             "|" + "|".join("---:" if _numeric(table.rows[0][i]) else "---" for i in range(len(table.columns))) + "|"]
    lines.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows)
    return [*lines, ""]


def to_markdown(report: Report, chart_dir: str) -> str:
    lines = [f"# {report.title}", "", report.period, "", f"Source: {report.source}  ", f"Generated {report.generated}",
             ""]
    if report.failures:
        lines += ["**Sections not computed**", ""] + [f"- {f.title}: {f.reason}" for f in report.failures] + [""]
    for section in report.sections:
        lines += [f"## {section.title}", "", section.about, ""]
        lines += [f"**{f}**\n" for f in section.findings]
        for table in section.tables:
            lines += _md_table(table)
        lines += [f"![{c.title}]({chart_dir}/{c.name}.png)\n" for c in section.charts]
    lines += ["## Method", ""] + [f"- {m}" for m in report.method] + [""]
    return "\n".join(lines)


def write(report: Report, out: Path, stem: str) -> list[Path]:
    """The HTML, the Markdown, and the Markdown's PNGs under `charts/`; returns the paths written."""
    charts = out / "charts"
    charts.mkdir(parents=True, exist_ok=True)
    written = []
    for section in report.sections:
        for chart in section.charts:
            path = charts / f"{chart.name}.png"
            path.write_bytes(chart.png)
            written.append(path)
    for path, text in ((out / f"{stem}.html", to_html(report)), (out / f"{stem}.md", to_markdown(report, "charts"))):
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
