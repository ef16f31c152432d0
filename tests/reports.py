"""What the report tests share: simulated history imported into a real Prometheus, the committed rule
groups evaluated over it with promtool, and readers for the tables and pages the reports write."""

from __future__ import annotations

import asyncio
import html
import html.parser
import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from gpufleet.alerts.cli import RULES_FILE
from gpufleet.simulator.fleet import Fleet
from gpufleet.simulator.history import History, write_openmetrics

from programs import binary, prometheus

DAY = 86400


def backfill(tmp: Path, fleet: Fleet, start: float, end: float, step: float, metrics: re.Pattern[str],
             hold: float = 0.0) -> tuple[Path, int]:
    """The fleet's history, every `step` from `start` to `end`, imported into `tmp/data` in day-long blocks,
    a day at a time (a month of hundreds of nodes does not fit in memory at once); and how many node
    collections it took (see `History` for `hold`)."""
    past = History(fleet, start, metrics, {"cluster": "test"}, hold)
    data, dump = tmp / "data", tmp / "history.om"
    fleet.start()
    try:
        day = start
        while day <= end:  # Cut at UTC midnight, where promtool's day-long blocks end.
            last = min(end, day + ((day // DAY + 1) * DAY - day - 1) // step * step)
            families = asyncio.run(past.samples(day, last, step))
            day = last + step
            with dump.open("w") as out:
                write_openmetrics(families, out)
            subprocess.run([binary("promtool", "prometheus"), "tsdb", "create-blocks-from", "openmetrics",
                            "--max-block-duration=24h", str(dump), str(data)], check=True, capture_output=True,
                           timeout=600)
    finally:
        for node in fleet.nodes.values():
            node.close()
    dump.unlink()
    return data, past.collections


def _config(tmp: Path) -> Path:
    path = tmp / "prometheus.yml"
    path.write_text("global:\n  scrape_interval: 1m\n")  # Nothing to scrape: the data is all imported.
    return path


@contextmanager
def recorded(tmp: Path, data: Path, start: float, end: float, groups: tuple[str, ...],
             records: frozenset[str] | None = None, **web: Path) -> Iterator[str]:
    """Prometheus on `data` after the committed rule `groups` (only their `records`, where given) were
    evaluated from `start` to `end` into it, each at its own interval, as Prometheus would have recorded them."""
    committed = yaml.safe_load(RULES_FILE.read_text())["groups"]
    kept = [{**g, "rules": [r for r in g["rules"] if records is None or r["record"] in records]}
            for g in committed if g["name"] in groups]
    rules = tmp / "report-rules.yml"
    rules.write_text(yaml.safe_dump({"groups": kept}))
    blocks = tmp / "recorded"
    with prometheus(_config(tmp), data) as url:
        # Day-long blocks: in promtool's default of 2 hours, a month of a dozen rules is thousands of blocks,
        # minutes to write and to open; much longer ones lose the samples before the last block's start.
        subprocess.run([binary("promtool", "prometheus"), "tsdb", "create-blocks-from", "rules", f"--url={url}",
                        f"--start={int(start)}", f"--end={int(end) + 1}", f"--output-dir={blocks}",
                        "--max-block-duration=24h", str(rules)], check=True, capture_output=True, timeout=600)
    for block in blocks.iterdir():
        block.rename(data / block.name)
    with prometheus(_config(tmp), data, **web) as url:
        yield url


def markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Caption (the bold line above a table) -> rows of cells, header first."""
    tables, caption = {}, None
    for line in text.splitlines():
        if line.startswith("**") and line.endswith("**"):
            caption = line.strip("*")
        elif line.startswith("| ") and caption is not None:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            tables.setdefault(caption, []).append(cells)
    return tables


class HtmlTables(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._caption: str | None = None
        self._text: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("caption", "td", "th"):
            self._text = []
        elif tag == "tr":
            self._row = []

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption":
            self._caption, self._text = "".join(self._text or []), None
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._text or []).strip())
            self._text = None
        elif tag == "tr" and self._caption is not None:
            self.tables.setdefault(self._caption, []).append(self._row or [])


def rows(tables: dict, caption: str) -> list[dict[str, str]]:
    header, *body = tables[caption]
    return [dict(zip(header, row, strict=True)) for row in body]


def number(cell: str) -> float:
    return float(cell.replace(",", "").removesuffix("%").removesuffix(" W").removesuffix(" kW"))


def interval(cell: str) -> tuple[float, float]:
    """The bounds of a cell that gives an interval as two numbers joined by an en dash."""
    low, high = cell.split("\N{EN DASH}")
    return number(low), number(high)


_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message || (e.target && e.target.src))), true);
window.addEventListener("load", () => {
  const p = document.createElement("pre"); p.id = "probe";
  p.textContent = JSON.stringify({errors: window.__errors, tables: document.querySelectorAll("table").length,
    images: [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])});
  document.body.appendChild(p);
});
</script>"""


def opened_in_chromium(page: Path, tmp: Path) -> dict:
    """What headless Chromium made of the page: script errors, tables, and each image's load state and size."""
    probed = tmp / "probed.html"
    probed.write_text(page.read_text().replace("<head>", "<head>" + _PROBE, 1))
    dom = subprocess.run([binary("chromium", "chromium"), "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=5000", f"--user-data-dir={tmp / 'profile'}", "--dump-dom",
                          probed.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)[1]))


def drawn(png: Path) -> bool:
    """A chart with something on it: more than a blank canvas's few colours."""
    from matplotlib import image
    pixels = image.imread(png)
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7].tolist()}
    return png.stat().st_size > 10_000 and len(colours) > 20
