"""The compose stack as it runs here: Docker has no engine on these machines, so each service's container paths
are mapped back to the repository file or a temporary directory through the service's own mounts, and the
service names it calls become loopback addresses. promtool, amtool, Prometheus, Alertmanager and the
VictoriaMetrics programs then run the very files the stack mounts."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from gpufleet.devtools.compose import SERVICES, with_defaults
from gpufleet.devtools.delivery import alertmanager_alerts
from gpufleet.devtools.net import free_port, free_ports
from gpufleet.devtools.paths import COMPOSE_DIR
from gpufleet.devtools.programs import alertmanager, simulator

NODES = {f"gpu-node-{n:04d}" for n in range(1, 17)}  # The compose simulator's 16 nodes.


def mounts(service: str) -> list[tuple[str, str]]:
    """(source, container path) of each volume: a path for a bind mount, a name for a named volume."""
    result = []
    for volume in SERVICES[service].get("volumes", []):
        source, target, *_ = volume.split(":")
        result.append((source, target))
    return result


def host_path(service: str, container_path: str, named: dict[str, Path] | None = None) -> Path:
    """Where a container path of `service` lies here: through the deepest mount that holds it."""
    path = PurePosixPath(container_path)
    best = None
    for source, target in mounts(service):
        holds = path == PurePosixPath(target) or PurePosixPath(target) in path.parents
        if holds and (best is None or len(target) > len(best[1])):
            best = (source, target)
    assert best is not None, f"{service} mounts nothing at {container_path}"
    source, target = best
    base = (COMPOSE_DIR / source).resolve() if source.startswith(".") else (named or {}).get(source, Path(source))
    return base / path.relative_to(target)


def flag(argv: list[str], name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{name}="))


def host_config(service: str, container_file: str, path: Path, named: dict[str, Path],
                addresses: dict[str, str]) -> Path:
    """A config file the service mounts, with the container paths it lists mapped here and `addresses` substituted."""
    text = host_path(service, container_file).read_text()
    for container in sorted(set(re.findall(r"^\s+- (/\S+)", text, re.M)), key=len, reverse=True):
        text = text.replace(container, str(host_path(service, container, named)))
    for compose_address, address in addresses.items():
        text = text.replace(compose_address, address)
    path.write_text(text)
    return path


def host_command(service: str, named: dict[str, Path], addresses: dict[str, str],
                 files: dict[str, Path]) -> list[str]:
    """The service's `-flag=value` command line as it runs here: its own listen address and the compose names it
    calls become loopback addresses, container paths map through its mounts (or to `files`, for configs that
    were themselves mapped), and `${NAME:-default}` takes its default, as compose does without a .env."""
    argv = []
    for arg in SERVICES[service]["command"]:
        name, equals, value = arg.partition("=")
        if not equals:
            argv.append(arg)
            continue
        value = with_defaults(value)
        if name == "-httpListenAddr":
            value = addresses[service + value]
        elif value in files:
            value = str(files[value])
        elif value.startswith("/"):
            value = str(host_path(service, value, named))
        for compose_address, address in addresses.items():
            value = value.replace(compose_address, address)
        argv.append(f"{name}={value}")
    return argv


def scrape_job(config: dict, name: str = "gpufleet") -> dict:
    return next(job for job in config["scrape_configs"] if job["job_name"] == name)


@contextlib.contextmanager
def compose_alertmanager_and_simulator(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """Alertmanager with the compose routing and the simulator with its compose command line; yields their URLs
    and the directory that stands for the sim-targets volume."""
    am_data, sim_volume, secrets = tmp_path / "am", tmp_path / "sim-targets", tmp_path / "secrets"
    sim_volume.mkdir()
    secrets.mkdir()
    (secrets / "pagerduty-routing-key").write_text("test-key\n")
    routing = tmp_path / "alertmanager.yml"  # Secrets from here, PagerDuty at a closed loopback port.
    routing.write_text((COMPOSE_DIR / "alertmanager" / "alertmanager.yml").read_text()
                       .replace("/etc/alertmanager/secrets", str(secrets))
                       .replace("jiralert:9097", f"127.0.0.1:{free_port()}"))
    simulate = SERVICES["simulator"]["command"]
    args = [arg for arg in simulate[1:] if not arg.startswith(("--web.listen-address", "--file-sd", "--probe-"))]
    args = [f"--scenario={host_path('simulator', flag(simulate, '--scenario'))}" if a.startswith("--scenario") else a
            for a in args]
    probes = [f"--probe-ports={free_ports(len(NODES))}",
              f"--probe-sd={sim_volume / PurePosixPath(flag(simulate, '--probe-sd')).name}"]
    with (alertmanager(am_data, routing) as am,
          simulator(sim_volume / "targets.json", *args, *probes, timeout=60) as sim):
        yield am.url, sim.url, sim_volume


def paged(am_url: str, alertname: str) -> list[dict]:
    """The alerts named `alertname` that Alertmanager holds."""
    return [a for a in alertmanager_alerts(am_url) if a["labels"]["alertname"] == alertname]
