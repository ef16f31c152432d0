from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.devtools.nodes import FakeClock, two_boards
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.gpu.simulated.nvml import SimulatedNvml


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A private copy of the fixture sysfs tree that a test may damage."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE_SYSFS, root, symlinks=True)
    return root


@pytest.fixture
def clock() -> FakeClock:
    """The clock of the simulated NVML library and of the session over it, moved by hand."""
    return FakeClock()


@pytest.fixture
def nvml(clock: FakeClock) -> SimulatedNvml:
    """The two boards of gpufleet.devtools.nodes.two_boards behind the simulated library, on `clock`."""
    return SimulatedNvml(two_boards(), clock=clock)
