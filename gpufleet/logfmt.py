"""logfmt log lines (`ts=... level=... msg=...`), the format Prometheus' own Go exporters write."""

from __future__ import annotations

import logging
import time

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
          logging.CRITICAL: "error"}


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        level = _NAMES.get(record.levelno, "info")
        line = f"ts={ts} level={level} logger={record.name} msg={_quote(record.getMessage())}"
        if record.exc_info:
            line += f" err={_quote(self.formatException(record.exc_info))}"
        return line


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    logging.getLogger("aiohttp").setLevel(max(_LEVELS[level], logging.WARNING))
