"""Where things are in a gpufleet checkout: the harness and the builders run from one, never from a wheel."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpufleet.devtools.waiting import HarnessError

# devtools/ sits at the top of the checkout, linked into gpufleet/; resolving the link finds the checkout.
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
FIXTURE_SYSFS = FIXTURES / "sys"
COMPOSE_DIR = ROOT / "compose"
ROUTING = COMPOSE_DIR / "alertmanager" / "alertmanager.yml"


def checkout() -> Path:
    """The checkout's root, or a HarnessError saying that this needs one (an installed wheel has no tests/)."""
    if not (ROOT / "pyproject.toml").is_file() or not FIXTURES.is_dir():
        raise HarnessError(f"{ROOT} is not a gpufleet checkout: clone the repository and run this from it")
    return ROOT


@contextlib.contextmanager
def memory_directory() -> Iterator[Path]:
    """A temporary directory in memory (/dev/shm) where the machine has one, else on disk. The simulator writes
    each node's sysfs and procfs out here for node_exporter (`--node-exporter-root`), which on a real node live in
    memory too: on a virtual disk a file replaced costs many times what it does in memory, and a fleet's counters
    rewritten at every collection kept the simulator from answering its scrapes."""
    shm = "/dev/shm"
    place = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    with tempfile.TemporaryDirectory(prefix="gpufleet-", dir=place) as directory:
        yield Path(directory)
