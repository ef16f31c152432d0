"""The flag reference: every flag of every `gpufleet` command, read from the parsers the commands run."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from gpufleet import flags
from gpufleet.cli import build_parser
from gpufleet.devtools.reference.markdown import GENERATED, cell, code, table

INTRO = """# Flags

Every flag of every `gpufleet` command, as its parser defines it. Invalid flags end a command with a one-line
message and exit code 2; a combination that cannot work ends it with exit code 1. Durations take one grammar
everywhere: Prometheus's (`500ms`, `5s`, `1m30s`, `30d`), plus plain seconds.
"""


def _commands(parser: argparse.ArgumentParser, path: str = "gpufleet") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each runnable command with its parser, depth first, in the order the parsers list them."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
        return
    for action in subcommands:
        for name, child in action.choices.items():
            yield from _commands(child, f"{path} {name}")


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    names = " / ".join(action.option_strings)
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return names
    if isinstance(action.metavar, str):
        metavar = action.metavar
    elif action.choices is not None:
        metavar = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    else:
        metavar = action.dest.upper()
    return f"{names} {metavar}"


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    if isinstance(action.default, bool):
        return "on" if action.default else "off"
    if isinstance(action.default, list | tuple):
        return ", ".join(str(v) for v in action.default)
    if action.type is flags.duration and isinstance(action.default, int | float):
        return f"{action.default:g}s"
    if isinstance(action.default, re.Pattern):
        return str(action.default.pattern)
    if isinstance(action.default, str | int | float | Path):
        return str(action.default)
    return ""  # A built object (the rules' configuration, say): the help says what it stands for.


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as `--help` prints it, with `%(default)s` and the like expanded."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    text = parser._get_formatter()._expand_help(action)
    start = text.rfind("(default: ")
    balanced = text.endswith(")") and text[start:].count("(") == text[start:].count(")")
    if start >= 0 and balanced and _default(action):
        text = text[:start].rstrip()  # The default has its own column.
    return text


def page() -> str:
    sections = [GENERATED.format(source="the command-line parsers (`gpufleet.cli.build_parser`)"), INTRO]
    for path, parser in _commands(build_parser()):
        rows = [(code(_flag(a)), code(_default(a)), cell(_help(parser, a)))
                for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        heading = f"## `{path}`\n\n{cell(parser.description or '')}\n\n"
        sections.append(heading + table(["flag", "default", "meaning"], rows))
    return "\n".join(sections)
