"""A one-line progress bar on a terminal, and silence anywhere else (cron, CI logs, pipes)."""

from __future__ import annotations

from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO, enabled: bool, width: int = 30) -> None:
        self.total, self.done, self.queries = total, 0, 0
        self._stream, self._enabled, self._width = stream, enabled, width

    def query_done(self) -> None:
        self.queries += 1
        self._draw()

    def section_done(self) -> None:
        self.done += 1
        self._draw()

    def _draw(self) -> None:
        if not self._enabled:
            return
        filled = self._width * self.done // max(1, self.total)
        bar = "#" * filled + "-" * (self._width - filled)
        self._stream.write(f"\r[{bar}] {self.done}/{self.total} sections, {self.queries} queries")
        self._stream.flush()

    def finish(self) -> None:
        if self._enabled:
            self._stream.write("\r\033[K")
            self._stream.flush()
