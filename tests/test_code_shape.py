"""Rooms with one purpose: no module of the project over 500 lines (the NVML facade, which mirrors pynvml's
surface, excepted), and no function over 60 lines that branches. A file or function past these has grown a
second concern; split it along its seams before adding to it."""

from __future__ import annotations

import ast
import subprocess

from gpufleet.devtools.paths import ROOT

MAX_LINES = 500
MAX_FUNCTION = 60
EXCEPTED = {"exporter/gpu/simulated/nvml.py"}  # pynvml's function surface, one method per NVML call.
BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)


def sources() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [path for path in listed if (ROOT / path).is_file() and not (ROOT / path).is_symlink()]


def test_no_module_is_over_500_lines() -> None:
    long = {path: n for path in sources() if path not in EXCEPTED
            and (n := len((ROOT / path).read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_function_that_branches_is_over_60_lines() -> None:
    long = []
    for path in sources():
        for found in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (found.end_lineno or found.lineno) - found.lineno + 1
                if length > MAX_FUNCTION and any(isinstance(n, BRANCHES) for n in ast.walk(found)):
                    long.append(f"{path}:{found.lineno} {found.name} ({length} lines)")
    assert long == []
