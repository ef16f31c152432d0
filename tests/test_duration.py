"""The one duration grammar: what flags, scenario and layout files and the rule configuration accept."""

import pytest

from gpufleet.duration import DurationError, parse, render, spoken


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("1m30s500ms", 90.5), ("2w", 1_209_600),
    ("1y", 31_536_000), ("90", 90), ("0.5", 0.5), (" 15m ", 900), (120, 120), (0.25, 0.25),
])
def test_what_parses(text, seconds):
    assert parse(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "1.5m", "5x", "1m1h", "-5s", "1 m", True, -1])
def test_what_is_refused(text):
    with pytest.raises(DurationError):
        parse(text)


@pytest.mark.parametrize(("seconds", "text"), [(5400, "1h30m"), (0.25, "250ms"), (90.5, "1m30s500ms"), (0, "0s"),
                                                (1_209_600, "2w"), (113, "1m53s")])
def test_what_renders_parses_back(seconds, text):
    assert render(seconds) == text and parse(text) == seconds


@pytest.mark.parametrize(("text", "words"), [("5m", "5 minutes"), ("1m", "1 minute"), ("90s", "90 seconds"),
                                             ("1h", "1 hour"), ("2w", "2 weeks"), ("1m30s", "90 seconds")])
def test_what_prose_says(text, words):
    assert spoken(text) == words
