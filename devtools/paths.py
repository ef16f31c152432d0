"""Where things are in a gpufleet checkout: the harness and the builders run from one, never from a wheel."""

from __future__ import annotations

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
