"""Flag value types in the style of Prometheus exporters, each failing with a message argparse shows."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from gpufleet import duration as durations


def duration(text: str) -> float:
    """A duration in gpufleet's one grammar (`500ms`, `5s`, `1h30m`, `30d`, or plain seconds); always positive."""
    try:
        seconds = durations.parse(text)
    except durations.DurationError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration {text!r} must be greater than zero")
    return seconds


def _count(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"count {text!r} must be at least {least}")
    return value


def number_in(what: str, low: float, high: float, low_included: bool = False,
              high_included: bool = True) -> Callable[[str], float]:
    """A flag type for a number between `low` and `high` (each bound in or out); errors name it `what`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}") from None
        if not ((low <= value) if low_included else (low < value)) or not (
                (value <= high) if high_included else (value < high)):
            raise argparse.ArgumentTypeError(
                f"{what} {text!r} must be {'at least' if low_included else 'above'} {low:g} and "
                f"{'at most' if high_included else 'below'} {high:g}")
        return value

    return parse


def positive_int(text: str) -> int:
    return _count(text, 1)


def non_negative_int(text: str) -> int:
    """A count where 0 means "no limit"."""
    return _count(text, 0)


def regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"invalid regular expression {text!r}: {err}") from None


def listen_address(text: str) -> tuple[str | None, int]:
    """`HOST:PORT`, `:PORT` (every interface) or `[IPv6]:PORT` -> (host or None, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise argparse.ArgumentTypeError(f"invalid listen address {text!r} (use HOST:PORT or :PORT)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or None, int(port_text))
