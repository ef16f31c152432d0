"""The `gpufleet` dispatcher: every subcommand reachable, and a subcommand that imports only its own package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet.cli import COMMANDS, build_parser


def subcommands(parser) -> set[str]:
    [action] = [a for a in parser._actions if a.dest == "command"]
    return set(action.choices)


@pytest.mark.parametrize("name", COMMANDS)
def test_each_subcommand_comes_from_the_module_the_dispatcher_names(name):
    assert subcommands(build_parser(name)) == {name}


def test_without_a_subcommand_the_parser_offers_them_all():
    assert subcommands(build_parser()) == set(COMMANDS) == subcommands(build_parser("--help"))


def test_an_unknown_subcommand_is_refused_with_the_known_ones():
    result = subprocess.run([sys.executable, "-m", "gpufleet", "expoter"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "invalid choice: 'expoter'" in result.stderr and all(name in result.stderr for name in COMMANDS)


def test_the_exporter_loads_none_of_the_other_packages():
    script = ("import sys; from gpufleet.cli import build_parser; build_parser('exporter').parse_args(['exporter']); "
              "print(' '.join(sorted({m.split('.')[1] for m in sys.modules if m.startswith('gpufleet.')})))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    packages = {module.split(".")[1] for module in COMMANDS.values()}
    assert set(result.stdout.split()) & packages == {"exporter"}
