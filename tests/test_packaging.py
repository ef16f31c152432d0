"""The distribution as a user installs it: one top-level import name, everything importable from the wheel alone,
and the layers of the exporter importing only downwards."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from gpufleet import __version__

ROOT = Path(__file__).parent.parent

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
    """A wheel built from a copy of the checkout, so the build leaves nothing in the working tree."""
    source, out = tmp_path_factory.mktemp("source") / "gpufleet", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)],
                   check=True, capture_output=True, timeout=300)
    [built] = out.glob("gpufleet-*.whl")
    return built


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return ({node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
            | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names})


def test_the_gpu_layer_returns_records_and_never_reaches_up_into_the_collectors():
    for path in sorted((ROOT / "exporter" / "gpu").rglob("*.py")):
        assert not {m for m in imports(path) if m.startswith("gpufleet.exporter.collector")}, path.name


def test_the_collectors_import_the_hardware_never_the_node_that_builds_them():
    for path in sorted((ROOT / "exporter" / "collector").glob("*.py")):
        assert "gpufleet.exporter.node" not in imports(path), path.name


def test_the_rules_dashboards_and_reports_import_nothing_of_the_exporter():
    for package in ("alerts", "dashboards", "report"):
        for path in sorted((ROOT / package).glob("*.py")):
            assert not {m for m in imports(path) if m.startswith("gpufleet.exporter")}, f"{package}/{path.name}"


@pytest.mark.slow
def test_the_wheel_adds_exactly_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = archive.read(f"gpufleet-{__version__}.dist-info/top_level.txt").decode().split()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"gpufleet"}
    assert top_level == ["gpufleet"]
    assert not [name for name in names if name.startswith("gpufleet/devtools/")], "the harness runs from a checkout"
    for data in ("gpufleet/py.typed", "gpufleet/alerts/gpufleet-rules.yml",
                 "gpufleet/alerts/gpufleet-vmalert-rules.yml", "gpufleet/simulator/scenarios/demo.yml",
                 "gpufleet/simulator/fault-rates/llama3.yml",
                 "gpufleet/dashboards/json/gpufleet-fleet.json", "gpufleet/dashboards/fleet-overview.dashboard.py",
                 "gpufleet/deploy/alertmanager.yml"):
        assert data in names, data


@pytest.mark.slow
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
    # Outside a checkout, a build names where to write: here, the wheel's own copies, which must be current.
    for command in (["alerts", "build", "--check", f"--output-dir={site / 'gpufleet' / 'alerts'}"],
                    ["dashboards", "build", "--check", f"--output={site / 'gpufleet' / 'dashboards' / 'json'}"],
                    ["alerts", "build", "--check"]):
        check = subprocess.run([sys.executable, "-P", "-m", "gpufleet", *command], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == (2 if command == ["alerts", "build", "--check"] else 0), check.stderr
    # The Kubernetes manifests from the wheel alone are the committed ones.
    check = subprocess.run([sys.executable, "-P", "-m", "gpufleet", "deploy", "kubernetes", "--check",
                            f"--output={ROOT / 'deploy' / 'kubernetes'}"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0, check.stderr


@pytest.mark.slow
def test_a_gpu_node_installs_the_exporters_dependencies_and_no_plotting_stack(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"gpufleet-{__version__}.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    always = sorted(r.split(">")[0].split("=")[0].split(";")[0].strip() for r in requires if "extra ==" not in r)
    assert always == ["aiohttp", "bcrypt", "nvidia-ml-py", "prometheus-client", "psutil", "pyyaml"]
    assert any(r.startswith("matplotlib") and 'extra == "reports"' in r for r in requires)
    assert any(r.startswith("grafanalib") and 'extra == "dashboards"' in r for r in requires)


# The command with a package made unimportable, as where its extra was never installed.
_WITHOUT = "import sys; sys.modules[sys.argv[1]] = None; from gpufleet.cli import main; sys.exit(main(sys.argv[2:]))"


@pytest.mark.parametrize(("module", "command", "extra"), [
    ("matplotlib", ["report", "capacity", "--prometheus=http://127.0.0.1:9", "--out=unused"], "reports"),
    ("grafanalib", ["dashboards", "build", "--check"], "dashboards"),
    ("grafanalib", ["deploy", "kubernetes", "--check"], "dashboards")])
def test_a_command_whose_extra_is_missing_says_which_in_one_line(module, command, extra, tmp_path):
    done = subprocess.run([sys.executable, "-c", _WITHOUT, module, *command], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gpufleet {' '.join(command[:2])}: needs the {extra} extra, which is not installed: "
        f"pip install 'gpufleet[{extra}]'"]
    assert not (tmp_path / "unused").exists()


def _dockerfile() -> tuple[list[tuple[str, str]], str]:
    """Each file or folder the Dockerfile copies, with where it lands under its WORKDIR; and the argument of its
    `pip install`."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    copies = []
    for line in text.splitlines():
        if line.startswith("COPY "):
            *sources, destination = line.split()[1:]
            copies += [(source, f"{destination}{Path(source).name}" if destination.endswith("/") else destination)
                       for source in sources]
    [install] = re.findall(r"^RUN pip install (\S+)", text, re.M)
    return copies, install.strip("'")


def test_the_image_copies_every_folder_the_package_links_and_the_context_admits_them():
    copies, install = _dockerfile()
    sources = {source for source, _ in copies}
    linked = {link.name for link in (ROOT / "gpufleet").iterdir() if link.is_symlink()}
    assert linked - {"devtools"} <= sources, "the image leaves out a folder gpufleet/ links to"
    admitted = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.startswith("!")]
    assert [s for s in sources if not any(s == a or s.startswith(f"{a}/") for a in admitted)] == []
    extras = re.fullmatch(r"\.\[([a-z,]+)\]", install)
    assert extras is not None, install
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.group(1).split(",")) <= set(declared)


@pytest.mark.slow
def test_the_images_install_step_builds_the_package_from_what_it_copies(tmp_path: Path) -> None:
    """The Dockerfile's COPY lines into an empty directory, and its `pip install` in a clean virtual environment
    there: the image's package builds from its own context and runs (no Docker engine runs here)."""
    copies, install = _dockerfile()
    context = tmp_path / "src"
    for source, destination in copies:
        target = context / destination
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / source).is_dir() and not (ROOT / source).is_symlink():
            shutil.copytree(ROOT / source, target, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / source, target, follow_symlinks=False)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", install], cwd=context,
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    ran = subprocess.run([str(venv / "bin" / "gpufleet"), "--version"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert ran.stdout.strip() == f"gpufleet {__version__}", ran.stderr
    grpc = subprocess.run([str(venv / "bin" / "python"), "-c", "import grpc"], capture_output=True, timeout=60)
    assert grpc.returncode == 0, "the kubernetes extra names pods through grpc"
