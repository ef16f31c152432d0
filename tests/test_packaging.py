"""The distribution as a user installs it: one top-level import name, and everything importable from the wheel alone."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpufleet import __version__

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.slow

# Run from the unpacked wheel, with neither the repository nor its editable install in the way: every
# module is imported, each must come from the wheel, and the packaged rules and dashboards are current.
_IMPORT_ALL = """
import importlib, pkgutil, sys
import gpufleet
root = sys.argv[1]
names = [m.name for m in pkgutil.walk_packages(gpufleet.__path__, "gpufleet.") if not m.name.endswith("__main__")]
outside = [name for name in names if not importlib.import_module(name).__file__.startswith(root)]
assert not outside, outside
print(gpufleet.__version__, len(names))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    [built] = out.glob("gpufleet-*.whl")
    return built


def test_the_wheel_adds_exactly_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = archive.read(f"gpufleet-{__version__}.dist-info/top_level.txt").decode().split()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"gpufleet"}
    assert top_level == ["gpufleet"]
    for data in ("gpufleet/py.typed", "gpufleet/alerts/gpufleet-rules.yml", "gpufleet/simulator/scenarios/demo.yml",
                 "gpufleet/dashboards/json/gpufleet-fleet.json", "gpufleet/dashboards/fleet-overview.dashboard.py"):
        assert data in names, data


def test_every_module_imports_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    # -P: the working directory is not put on sys.path, so the repository's folders cannot stand in.
    imported = subprocess.run([sys.executable, "-P", "-c", _IMPORT_ALL, str(site)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    version, count = imported.stdout.split()
    assert version == __version__ and int(count) > 40
    for command in (["alerts", "build", "--check"], ["dashboards", "build", "--check"]):
        check = subprocess.run([sys.executable, "-P", "-m", "gpufleet", *command], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == 0, check.stderr
