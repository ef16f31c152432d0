"""The deployment, checked through its parts: Docker has no engine here, the real Prometheus tools do.

The compose file is read as data; every container path its services use is mapped back to the
repository file or a temporary directory through the service's own mounts, so promtool, amtool,
Prometheus and Alertmanager run the very files the stack mounts. Only addresses change: service
names become loopback ports, and the simulator stands in for the fleet.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import pytest
import yaml

from gpufleet import __version__
from gpufleet.alerts.cli import RULES_FILE, VMALERT_RULES_FILE
from gpufleet.alerts.config import Config
from gpufleet.cli import build_parser
from gpufleet.dashboards.cli import OUTPUT as DASHBOARDS
from gpufleet.devtools.compose import AGENTS, COMPOSE, SERVICES, command_flags
from gpufleet.devtools.net import free_port, http
from gpufleet.devtools.paths import COMPOSE_DIR, ROOT
from gpufleet.devtools.programs import binary, blackbox_exporter, prometheus, remediator
from gpufleet.devtools.prom import query
from gpufleet.devtools.waiting import wait_for

from helpers import documented_yaml
from stack import compose_alertmanager_and_simulator, flag, host_config, host_path, mounts, paged, scrape_job

KUBERNETES = [doc for path in sorted((ROOT / "deploy" / "kubernetes" / "base").glob("*.yaml"))
              for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] != "Kustomization"]
DAEMONSET_CONTAINERS = [c for doc in KUBERNETES if doc["kind"] == "DaemonSet"
                        for c in doc["spec"]["template"]["spec"]["containers"]]
UNIT = ROOT / "deploy" / "systemd" / "gpufleet-exporter.service"
IMAGE = f"ghcr.io/gpufleet/gpufleet:{__version__}"
COMMITTED_GROUPS = sorted(g["name"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"])


# What a Slurm client host has, for the remediator: not the repository's to provide.
SLURM_HOST_PATHS = {"/etc/slurm", "/run/munge"}


def test_every_mounted_file_exists_and_every_named_volume_is_declared():
    for service in SERVICES:
        for source, _ in mounts(service):
            if service == "remediate" and source in SLURM_HOST_PATHS:
                continue
            if source.startswith((".", "/")):
                assert (COMPOSE_DIR / source).exists(), f"{service} mounts {source}, which does not exist"
            else:
                assert source in COMPOSE["volumes"], f"{service} uses undeclared volume {source}"


def test_every_image_is_pinned_and_gpufleet_runs_one_image_everywhere():
    for name, service in SERVICES.items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), f"{name}: {image} is not pinned to a version"
    assert SERVICES["exporter"]["image"] == SERVICES["simulator"]["image"] == IMAGE
    assert [c["image"] for c in DAEMONSET_CONTAINERS] == [IMAGE]


def test_the_image_is_slim_pinned_non_root_and_checks_its_health():
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")]
    instructions = [tuple(line.split(None, 1)) for line in lines if line[0].isupper()]
    base = next(arg for op, arg in instructions if op == "FROM").removesuffix(" AS gpufleet")
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base
    user = [arg for op, arg in instructions if op == "USER"]
    assert user and not user[-1].startswith(("root", "0")), "the image must not run as root"
    assert ("ENTRYPOINT", '["gpufleet"]') in instructions
    assert any(op == "HEALTHCHECK" for op, _ in instructions)
    copied = [source for op, arg in instructions if op == "COPY" for source in arg.split()[:-1]]
    allowed = {line.removeprefix("!").rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    assert copied and all((ROOT / source).exists() and source in allowed for source in copied), (copied, allowed)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    excluded = {name.removeprefix("gpufleet.").rstrip("*") for name in packages.get("exclude", [])}
    linked = {link.readlink().name for link in (ROOT / "gpufleet").iterdir() if link.is_symlink()} - excluded
    assert {name.rstrip("*") for name in packages["include"]} | linked <= set(copied), "a package is left out"


def test_every_gpufleet_command_line_parses():
    """The compose services, the DaemonSet and the systemd unit start gpufleet with flags it accepts."""
    parser = build_parser()
    unit = re.search(r"^ExecStart=\S+ (.*)$", UNIT.read_text(), re.M).group(1)
    command_lines = [SERVICES["exporter"]["command"], SERVICES["simulator"]["command"],
                     [arg for arg in shlex.split(unit) if not arg.startswith("$")]]
    command_lines += [c["args"] for c in DAEMONSET_CONTAINERS]
    for argv in command_lines:
        parser.parse_args(argv)  # argparse exits on a flag it does not know


def test_services_reach_each_other_by_their_compose_names():
    config = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    alertmanagers = [t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"]
                     for t in sc["targets"]]
    assert alertmanagers == ["alertmanager:9093"] and "alertmanager" in SERVICES
    datasource = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/datasources/gpufleet.yml").read_text())
    assert urlparse(datasource["datasources"][0]["url"]).netloc == "prometheus:9090"
    simulate = SERVICES["simulator"]["command"]
    assert flag(simulate, "--file-sd.address") == "simulator:" + flag(simulate, "--web.listen-address").lstrip(":")
    for name, service in SERVICES.items():
        assert set(service.get("depends_on", {})) <= set(SERVICES), name
    # What the simulator writes, Prometheus reads: one volume, and a file_sd glob that matches the file.
    written = PurePosixPath(flag(simulate, "--file-sd"))
    volume = next(s for s, t in mounts("simulator") if PurePosixPath(t) in written.parents)
    read_at = next(t for s, t in mounts("prometheus") if s == volume)
    # Its exporters' targets, the gpufleet job alone; its probe targets, the probe job alone.
    probes = PurePosixPath(read_at) / PurePosixPath(flag(simulate, "--probe-sd")).name
    for job in config["scrape_configs"]:
        job_globs = [f for sd in job.get("file_sd_configs", []) for f in sd["files"]]
        assert any(probes.match(g) for g in job_globs) == (job["job_name"] == "gpufleet-probe"), job["job_name"]
        assert any((PurePosixPath(read_at) / written.name).match(g) for g in job_globs) == (
            job["job_name"] == "gpufleet"), job["job_name"]
    assert "blackbox" in SERVICES and flag(SERVICES["blackbox"]["command"], "--web.listen-address") == ":9115"


def test_the_exporter_sees_the_host():
    exporter = SERVICES["exporter"]
    assert exporter["network_mode"] == "host" and exporter["pid"] == "host"
    assert {"/sys:/host/sys:ro", "/proc:/host/proc:ro"} <= set(exporter["volumes"])
    assert flag(exporter["command"], "--path.sysfs") == "/host/sys"
    assert flag(exporter["command"], "--path.procfs") == "/host/proc"
    devices = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]


def test_grafana_is_locked_down_and_provisions_every_dashboard():
    grafana = SERVICES["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?.+\}", env["GF_SECURITY_ADMIN_PASSWORD"]), \
        "the admin password must come from the uncommitted .env, and compose must refuse to start without it"
    ignored = subprocess.run(["git", "check-ignore", "-q", "compose/.env"], cwd=ROOT)
    assert ignored.returncode == 0, "compose/.env must be ignored by git"
    datasources = yaml.safe_load(host_path("grafana", "/etc/grafana/provisioning/datasources/gpufleet.yml")
                                 .read_text())["datasources"]
    dashboards = json.loads((DASHBOARDS / "gpufleet-fleet.json").read_text())
    default = next(v for v in dashboards["templating"]["list"] if v["name"] == "datasource")
    assert [d["uid"] for d in datasources] == [default["current"]["value"]] == ["gpufleet-prometheus"]
    providers = yaml.safe_load(host_path("grafana", "/etc/grafana/provisioning/dashboards/gpufleet.yml")
                               .read_text())["providers"]
    provided = {p.name for p in host_path("grafana", providers[0]["options"]["path"]).glob("*.json")}
    assert providers[0]["type"] == "file" and provided == {p.name for p in DASHBOARDS.glob("*.json")}
    assert len(provided) == 6


@pytest.mark.e2e
def test_promtool_accepts_the_prometheus_config_and_its_rules(tmp_path):
    config = host_config("prometheus", "/etc/prometheus/prometheus.yml", tmp_path / "prometheus.yml",
                         {"sim-targets": tmp_path}, {})
    check = subprocess.run([binary("promtool"), "check", "config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert re.search(r"SUCCESS: \d+ rules found", check.stdout + check.stderr)


@pytest.mark.e2e
def test_promtool_accepts_the_kubernetes_probe_job_of_the_docs(tmp_path):
    """The job docs/deployment/probes.md gives kube-prometheus-stack, as Prometheus would load it. Debian builds
    Prometheus without Kubernetes discovery: the node discovery is checked by its shape, the rest by promtool."""
    job = documented_yaml("deployment/probes.md", "Kubernetes")
    assert job[0].pop("kubernetes_sd_configs") == [{"role": "node"}]
    job[0]["file_sd_configs"] = [{"files": [str(tmp_path / "nodes.json")]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": job}))
    check = subprocess.run([binary("promtool"), "check", "config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert job[0]["job_name"] == Config().probe_job


def test_the_kubernetes_manifests_bound_their_resources_and_are_scraped_as_job_gpufleet():
    kinds = {doc["kind"]: doc for doc in KUBERNETES}
    assert set(kinds) == {"Namespace", "ServiceAccount", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule",
                          "AlertmanagerConfig", "ConfigMap"}
    pod = kinds["DaemonSet"]["spec"]["template"]
    for container in pod["spec"]["containers"]:
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), (container["name"], bound)
    assert pod["spec"]["hostNetwork"] and pod["spec"]["hostPID"]
    service, monitor = kinds["Service"], kinds["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    relabel = monitor["spec"]["endpoints"][0]["relabelings"]
    assert {"targetLabel": "job", "replacement": "gpufleet"} in relabel, "the rules select job=gpufleet"


@pytest.mark.e2e
def test_the_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    gpufleet = Path(sys.executable).with_name("gpufleet")  # Installed beside the Python running the tests.
    assert gpufleet.exists(), f"{gpufleet} is not installed"
    unit = tmp_path / UNIT.name  # The unit as installed, pointing at this checkout's gpufleet.
    unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={gpufleet}", UNIT.read_text(), flags=re.M))
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_the_stack_scrapes_the_simulator_loads_its_rules_and_pages_on_a_fault(tmp_path):
    """Prometheus and Alertmanager from their compose configs, the simulator from its compose command line."""
    with (compose_alertmanager_and_simulator(tmp_path) as (am_url, sim_url, sim_volume),
          remediator(os.environ) as remediate,  # The `remediate` profile's, in dry run, with no Slurm to reach.
          blackbox_exporter(host_path("blackbox", flag(SERVICES["blackbox"]["command"], "--config.file"))) as probe):
        port = free_port()
        config = host_config("prometheus", "/etc/prometheus/prometheus.yml", tmp_path / "prometheus.yml",
                             {"sim-targets": sim_volume}, {"alertmanager:9093": am_url.removeprefix("http://"),
                                                           "localhost:9090": f"127.0.0.1:{port}",
                                                           "remediate:19410": remediate.url.removeprefix("http://"),
                                                           "blackbox:9115": probe.url.removeprefix("http://")})
        with prometheus(config, tmp_path / "data", port) as prom:
            prom_url = prom.url

            def targets_up() -> list[dict] | None:
                active = json.loads(http("GET", f"{prom_url}/api/v1/targets")[1])["data"]["activeTargets"]
                return active if len(active) == 35 and all(t["health"] == "up" for t in active) else None

            active = wait_for(targets_up, 60, "all targets up")
            assert {t["labels"]["job"] for t in active} == {"gpufleet", "gpufleet-probe", "prometheus", "alertmanager",
                                                            "gpufleet-remediate"}
            # Each node probed under the `instance` its exporter has, and answering.
            wait_for(lambda: len(query(prom_url, 'probe_success{job="gpufleet-probe",cluster="sim"} == 1')) == 16, 30,
                     "every simulated node answering its probe")
            assert query(prom_url, 'count(up{job="gpufleet"} and on (cluster, instance) probe_success == 1) == 16')
            assert query(prom_url, 'gpufleet_remediate_dry_run{job="gpufleet-remediate"} == 1')
            groups = json.loads(http("GET", f"{prom_url}/api/v1/rules")[1])["data"]["groups"]
            assert sorted(g["name"] for g in groups) == COMMITTED_GROUPS
            assert all(r["health"] != "err" for g in groups for r in g["rules"])
            assert query(prom_url, 'count(gpufleet_gpu_up{cluster="sim"}) == 128')

            status, _ = http("POST", f"{sim_url}/control/faults",
                             {"kind": "xid", "node": "gpu-node-0001", "gpu": 0, "xid": 79})
            assert status == 201
            started = time.monotonic()
            alert = wait_for(lambda: paged(am_url, "GpuNeedsReboot"), 120, "GpuNeedsReboot at Alertmanager")[0]
    assert alert["labels"]["instance"] == "gpu-node-0001" and alert["labels"]["cluster"] == "sim"
    # A ticket, and the remediator's receiver, which names no service until a site runs one: it sends nothing.
    assert [r["name"] for r in alert["receivers"]] == ["remediate", "ticket"]
    print(f"fault to Alertmanager: {time.monotonic() - started:.0f}s")


# Profiles named beside one of the others (`--profile single --profile remediate`), each for one service.
ADD_ONS = {"remediate": "remediate"}


def profile_services(profile: str) -> set[str]:
    """What `docker compose --profile PROFILE up` starts: the services of that profile and those of none."""
    return {name for name, service in SERVICES.items() if profile in service.get("profiles", [profile])}


def test_every_profile_runs_one_rule_evaluator_one_grafana_and_what_they_depend_on():
    profiles = {p for service in SERVICES.values() for p in service.get("profiles", [])} - set(ADD_ONS)
    assert profiles == {"gpu", "sim", "single", "scale", "scale-sim"}
    assert all(SERVICES[name]["profiles"] == [add_on] for add_on, name in ADD_ONS.items())
    for profile in sorted(profiles):
        running = profile_services(profile)
        assert len(running & {"prometheus", "vmalert"}) == 1, (profile, running)
        assert len(running & {"grafana", "grafana-scale"}) == 1, (profile, running)
        published = [port.rsplit(":", 2)[-2] for name in running for port in SERVICES[name].get("ports", [])]
        assert len(published) == len(set(published)), (profile, published)
        for name in running:
            for dependency, condition in SERVICES[name].get("depends_on", {}).items():
                assert dependency in running or condition.get("required") is False, (profile, name, dependency)
    assert {"simulator", "vmalert"} <= profile_services("scale-sim")
    assert "simulator" not in profile_services("scale")


def test_the_scale_tier_scrapes_every_target_twice_and_evaluates_the_same_rules_as_prometheus():
    prometheus_yml = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    interval = prometheus_yml["global"]["scrape_interval"]
    storage = "http://victoriametrics" + command_flags("victoriametrics")["-httpListenAddr"]
    agents = [command_flags(name) for name in AGENTS]
    assert {a["-promscrape.cluster.membersCount"] for a in agents} == {str(len(AGENTS))}
    assert sorted(int(a["-promscrape.cluster.memberNum"]) for a in agents) == list(range(len(AGENTS)))
    # Each target twice, so that one vmagent lost loses no node; the store keeps one sample per scrape.
    assert {a["-promscrape.cluster.replicationFactor"] for a in agents} == {"2"}
    assert command_flags("victoriametrics")["-dedup.minScrapeInterval"] == interval
    assert {a["-remoteWrite.url"] for a in agents} == {storage + "/api/v1/write"}
    buffers = {source for name, a in zip(AGENTS, agents, strict=True)
               for source, target in mounts(name) if target == a["-remoteWrite.tmpDataPath"]}
    assert len(buffers) == len(AGENTS) and buffers <= set(COMPOSE["volumes"]), "each vmagent buffers on its own volume"
    for name, a in zip(AGENTS, agents, strict=True):
        scrape = yaml.safe_load(host_path(name, a["-promscrape.config"]).read_text())
        assert scrape["global"]["scrape_interval"] == interval
        assert scrape_job(scrape) == scrape_job(prometheus_yml), f"{name} scrapes gpufleet unlike Prometheus"
        assert scrape_job(scrape, "gpufleet-probe") == scrape_job(prometheus_yml, "gpufleet-probe"), name
    vmalert = command_flags("vmalert")
    assert host_path("vmalert", vmalert["-rule"]).resolve() == VMALERT_RULES_FILE.resolve()
    assert vmalert["-evaluationInterval"] == prometheus_yml["global"]["evaluation_interval"]
    assert vmalert["-datasource.url"] == vmalert["-remoteWrite.url"] == vmalert["-remoteRead.url"] == storage
    assert vmalert["-notifier.url"] == "http://alertmanager:9093" and "-disableAlertgroupLabel" in vmalert
    datasources = yaml.safe_load(host_path("grafana-scale", "/etc/grafana/provisioning/datasources/gpufleet.yml")
                                .read_text())["datasources"]
    assert [(d["uid"], d["url"]) for d in datasources] == [("gpufleet-prometheus", storage)]
