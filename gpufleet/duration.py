"""The one duration grammar of gpufleet: flags, scenario files and rule configuration all read it.

It is Prometheus's own, so a window written in a rule configuration means in PromQL what it means
everywhere else: whole numbers with units from the largest down (`500ms`, `30s`, `5m`, `1h30m`,
`2w`; units `y`, `w`, `d`, `h`, `m`, `s`, `ms`), and, for settings that are not PromQL, a plain
number of seconds (`90`, `0.5`).
"""

from __future__ import annotations

import re

_UNITS = (("y", 365 * 86400), ("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001))
_PROMETHEUS = re.compile("".join(rf"(?:(\d+){unit})?" for unit, _ in _UNITS))
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


class DurationError(ValueError):
    """Text that is not a duration; the message quotes it and shows the grammar."""


def parse(value: str | int | float) -> float:
    """Seconds in `value`: a duration such as `1h30m`, or a number of seconds. Never negative."""
    if isinstance(value, bool):
        raise DurationError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        if value < 0:
            raise DurationError(f"duration {value!r} is negative")
        return float(value)
    text = value.strip()
    if _SECONDS.fullmatch(text):
        return float(text)
    match = _PROMETHEUS.fullmatch(text)
    if not text or match is None:
        raise DurationError(f"invalid duration {value!r} (use for example 500ms, 30s, 5m, 1h30m)")
    return sum(int(count) * seconds for count, (_, seconds) in zip(match.groups(), _UNITS, strict=True) if count)


def spoken(value: str) -> str:
    """A duration in words for prose around a query, `5m` -> `5 minutes`, so that the prose reads the constant the
    query reads."""
    names = {"y": "year", "w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second", "ms": "millisecond"}
    seconds = parse(value)
    for unit, size in _UNITS:
        count = seconds / size
        if count >= 1 and count == int(count):
            return f"{int(count)} {names[unit]}{'s' if count != 1 else ''}"
    return render(seconds)


def render(seconds: float) -> str:
    """The shortest Prometheus form of `seconds`, to the millisecond: 5400 -> `1h30m`, 0.25 -> `250ms`."""
    if seconds < 0:
        raise DurationError(f"duration {seconds!r} is negative")
    left = round(seconds * 1000)
    parts = []
    for unit, size in _UNITS:
        count, left = divmod(left, round(size * 1000))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
