"""The compose file read as data: its services and their command lines, which the scale-tier benchmarks run
with the stack's own flags and the deployment tests check."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpufleet.devtools.paths import COMPOSE_DIR

COMPOSE: dict[str, Any] = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
AGENTS = sorted(name for name in SERVICES if name.startswith("vmagent-"))
_DEFAULTED = re.compile(r"\$\{\w+:-([^}]*)\}")


def with_defaults(value: str) -> str:
    """`value` with each `${NAME:-default}` replaced by its default, as compose does without a .env."""
    return _DEFAULTED.sub(r"\1", value)


def command_flags(service: str) -> dict[str, str]:
    """A Go program's `-flag=value` command line as a dict, as written (a bare `-flag` maps to "")."""
    return dict(arg.partition("=")[::2] for arg in SERVICES[service]["command"])


def compose_flags(service: str, dropped: tuple[str, ...]) -> list[str]:
    """The service's flags, less those starting with one of `dropped` (which the caller sets itself), with
    compose's defaults taken."""
    return [f"{name}={with_defaults(value)}" if value else name
            for name, value in command_flags(service).items() if not name.startswith(dropped)]


def victoria_metrics_flags() -> list[str]:
    """The store's flags in the stack, less its storage path and address, which a launcher sets."""
    return compose_flags("victoriametrics", ("-storageDataPath", "-httpListenAddr"))


def vmalert_flags() -> list[str]:
    """vmalert's flags in the stack, less its rules, its store, its Alertmanager and its addresses."""
    return compose_flags("vmalert", ("-rule", "-datasource.url", "-remoteWrite.url", "-remoteRead.url",
                                     "-notifier.url", "-httpListenAddr", "-external.url"))
