"""What the report tests alone need: the HTML page's tables, and what headless Chromium and the charts show."""

from __future__ import annotations

import html
import html.parser
import json
import re
import subprocess
from pathlib import Path

from gpufleet.devtools.programs import binary


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
    dom = subprocess.run([binary("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=5000", f"--user-data-dir={tmp / 'profile'}", "--dump-dom",
                          probed.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)[1]))


def drawn(png: Path) -> bool:
    """A chart with something on it: more than a blank canvas's few colours."""
    from matplotlib import image
    pixels = image.imread(png)
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7].tolist()}
    return png.stat().st_size > 10_000 and len(colours) > 20
