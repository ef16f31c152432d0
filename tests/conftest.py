from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import FIXTURE_SYSFS


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A private copy of the fixture sysfs tree that a test may damage."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE_SYSFS, root, symlinks=True)
    return root


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/fixtures/e2e-output.txt from what the exporter serves now")
