"""One launcher per real program the tests and benchmarks run, each on 127.0.0.1 and a free port.

Every launcher is a context manager that yields a running `Server` once it answers, and stops it however
the block ends. The programs are Debian's packages (`binary` says which one is missing) and gpufleet's
own commands, run with this interpreter.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpufleet import duration
from gpufleet.devtools.net import free_port
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.devtools.processes import Output, Server, serving
from gpufleet.devtools.waiting import HarnessError, wait_for

# The Debian package of every program the harness runs, named in the error when one is missing.
PACKAGES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "victoria-metrics": "victoria-metrics",
    "vmagent": "victoria-metrics",
    "vmalert": "victoria-metrics",
    "prometheus-node-exporter": "prometheus-node-exporter",
    "prometheus-blackbox-exporter": "prometheus-blackbox-exporter",
    "prometheus-ipmi-exporter": "prometheus-ipmi-exporter",
    "chromium": "chromium",
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "sbatch": "slurm-client",
}


def binary(name: str) -> str:
    """The path of a program from Debian's packages, or a HarnessError naming the package to install. Daemons
    (slurmctld, munged) are in /usr/sbin, which a user's PATH may leave out."""
    import os
    import shutil

    path = shutil.which(name, path=os.pathsep.join((os.environ.get("PATH", ""), "/usr/sbin", "/sbin")))
    if path is None:
        raise HarnessError(f"{name} is missing: install Debian's {PACKAGES.get(name, name)} package (.ci/run does)")
    return path


def gpufleet_command(*args: str, niceness: int = 0) -> list[str]:
    """The `gpufleet` command with this interpreter, at `niceness` where it is not 0: a simulator that stands
    for a fleet on machines of its own then yields the CPU to the servers under test. nice(1) execs, so the
    process's pid is gpufleet's."""
    return [*(["nice", "-n", str(niceness)] if niceness else []), sys.executable, "-m", "gpufleet", *args]


@contextlib.contextmanager
def exporter(*flags: str, gpus: int = 1, sysfs: Path = FIXTURE_SYSFS, timeout: float = 20,
             output: Output = "file") -> Iterator[Server]:
    """`gpufleet exporter` with simulated GPUs over a sysfs tree (the fixture's by default), once /metrics answers."""
    port = free_port()
    argv = gpufleet_command("exporter", "--gpu.backend=sim", f"--sim.gpus={gpus}", f"--path.sysfs={sysfs}",
                    f"--web.listen-address=127.0.0.1:{port}", *flags)
    with serving(argv, port, "/metrics", "exporter start", timeout, output=output) as server:
        yield server


@contextlib.contextmanager
def simulator(targets: Path, *args: str, timeout: float = 30, niceness: int = 0,
              output: Output = "file") -> Iterator[Server]:
    """`gpufleet simulate`, writing its file_sd targets to `targets`, once it answers."""
    port = free_port()
    argv = gpufleet_command("simulate", f"--web.listen-address=127.0.0.1:{port}", f"--file-sd={targets}", *args,
                    niceness=niceness)
    with serving(argv, port, "/healthz", "simulator start", timeout, output=output, stop_seconds=60) as server:
        yield server


def scrape_timing(interval: str) -> dict[str, str]:
    """A scrape interval, and a timeout just inside it."""
    return {"scrape_interval": interval, "scrape_timeout": f"{round(duration.parse(interval) * 1000) - 100}ms"}


def scrape_jobs(targets: Path | Sequence[Path], job: str = "gpufleet", cluster_label: str = "cluster",
                own: Mapping[str, int] | None = None, refresh: str | None = "1s",
                own_cluster: str | None = None) -> list[dict[str, Any]]:
    """The scrape job of the simulator's file_sd targets, named `job`; and one job per program in `own` (name
    to port), for a store that keeps the programs' own metrics.

    The simulator names each target's cluster in a `cluster` label; with another `cluster_label`, the job moves
    it there, as a site that names its clusters otherwise would. `refresh` is how often Prometheus rereads the
    targets (vmagent has a flag for it instead: None). `own_cluster` puts that cluster's label on the programs' own
    targets, as a site scrapes `gpufleet remediate` beside its cluster's nodes.
    """
    files = [str(targets)] if isinstance(targets, Path) else [str(t) for t in targets]
    sd: dict[str, Any] = {"files": files, **({"refresh_interval": refresh} if refresh else {})}
    scrape: dict[str, Any] = {"job_name": job, "file_sd_configs": [sd]}
    if cluster_label != "cluster":
        scrape["relabel_configs"] = [{"source_labels": ["cluster"], "target_label": cluster_label},
                                     {"action": "labeldrop", "regex": "cluster"}]
    labels = {"labels": {cluster_label: own_cluster}} if own_cluster else {}
    return [scrape, *({"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"], **labels}]}
                      for name, port in (own or {}).items())]


def prometheus_config(path: Path, targets: Path, interval: str, rules: Path | None = None,
                      alertmanager: str | None = None, job: str = "gpufleet", cluster_label: str = "cluster",
                      scrape_timeout: str | None = None, query_log: Path | None = None,
                      own: Mapping[str, int] | None = None, own_cluster: str | None = None) -> Path:
    """A Prometheus configuration that scrapes the simulator's targets (`scrape_jobs`) and evaluates `rules`
    every `interval`, sending alerts to `alertmanager`; written to `path`, which it returns."""
    settings = {**scrape_timing(interval), "evaluation_interval": interval}
    if scrape_timeout is not None:
        settings["scrape_timeout"] = scrape_timeout
    if query_log is not None:
        settings["query_log_file"] = str(query_log)
    config: dict[str, Any] = {"global": settings, "scrape_configs": scrape_jobs(targets, job, cluster_label, own,
                                                                                  own_cluster=own_cluster)}
    if rules is not None:
        config["rule_files"] = [str(rules)]
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [
            alertmanager.removeprefix("http://")]}]}]}
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def prometheus(config: Path, data: Path, port: int | None = None, web_config: Path | None = None,
               env: Mapping[str, str] | None = None, timeout: float = 60, output: Output = "file",
               flags: Sequence[str] = ()) -> Iterator[Server]:
    """Prometheus on `port` (a free one by default: pass one where its config must name its own address).

    With `web_config` (users and passwords), it is ready when it refuses an anonymous request. A year's
    retention: the report tests import months of history, which the default of 15 days would delete.
    """
    port = port or free_port()
    argv = [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1y",
            *flags]
    if web_config is not None:
        argv.append(f"--web.config.file={web_config}")
    with serving(argv, port, "/-/ready", "prometheus start", timeout, 401 if web_config else 200, output, env,
                 stop_seconds=60) as server:
        yield server


@contextlib.contextmanager
def alertmanager(data: Path, config: Path | None = None, timeout: float = 60) -> Iterator[Server]:
    """Alertmanager with `config`, or, without one, a route that sends every alert nowhere (vmalert needs an
    Alertmanager to notify; a benchmark wants no pages)."""
    if config is None:
        data.mkdir(parents=True, exist_ok=True)
        config = data / "alertmanager.yml"
        config.write_text("route: {receiver: nowhere}\nreceivers: [{name: nowhere}]\n")
    port, cluster_port = free_port(), free_port()
    argv = [binary("prometheus-alertmanager"), f"--config.file={config}", f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cluster_port}",
            "--log.level=warn"]
    with serving(argv, port, "/-/ready", "alertmanager start", timeout, stop_seconds=60) as server:
        yield server


@contextlib.contextmanager
def victoria_metrics(data: Path, *flags: str, port: int | None = None, timeout: float = 60,
                     output: Output = "file") -> Iterator[Server]:
    """A single-node VictoriaMetrics on `data`, with `flags` after its storage and address."""
    port = port or free_port()
    argv = [binary("victoria-metrics"), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *flags]
    with serving(argv, port, "/health", "victoria-metrics start", timeout, output=output, stop_seconds=60) as server:
        yield server


@contextlib.contextmanager
def vmagent(config: Path, remote_write: str, data: Path, *flags: str, port: int | None = None, timeout: float = 60,
            output: Output = "file") -> Iterator[Server]:
    """vmagent scraping as `config` says and writing to `remote_write` (a store's URL), buffering under `data`."""
    port = port or free_port()
    argv = [binary("vmagent"), f"-promscrape.config={config}", f"-remoteWrite.url={remote_write}/api/v1/write",
            f"-remoteWrite.tmpDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *flags]
    with serving(argv, port, "/health", "vmagent start", timeout, output=output, stop_seconds=60) as server:
        yield server


@contextlib.contextmanager
def vmalert(rules: Path, storage: str, alertmanager: str, *flags: str, port: int | None = None,
            timeout: float = 60, output: Output = "file") -> Iterator[Server]:
    """vmalert evaluating `rules` against `storage`, writing recorded series and alert state back to it (and
    restoring that state from it after a restart), and notifying `alertmanager`. Pass the `port` of a vmalert
    that was stopped to restart it where its clients look for it."""
    port = port or free_port()
    argv = [binary("vmalert"), f"-rule={rules}", f"-datasource.url={storage}", f"-remoteWrite.url={storage}",
            f"-remoteRead.url={storage}", f"-notifier.url={alertmanager}", f"-httpListenAddr=127.0.0.1:{port}",
            *flags]
    with serving(argv, port, "/health", "vmalert start", timeout, output=output, stop_seconds=60) as server:
        yield server


@contextlib.contextmanager
def blackbox_exporter(config: Path, timeout: float = 30) -> Iterator[Server]:
    """blackbox_exporter with `config` (its modules), once it answers."""
    port = free_port()
    argv = [binary("prometheus-blackbox-exporter"), f"--config.file={config}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with serving(argv, port, "/-/healthy", "blackbox_exporter start", timeout) as server:
        yield server


@contextlib.contextmanager
def ipmi_exporter(freeipmi: Path, config: Path, timeout: float = 30) -> Iterator[Server]:
    """ipmi_exporter with `config`, running the FreeIPMI programs in `freeipmi` (the tests' scripts that print
    recorded output), once it answers."""
    port = free_port()
    argv = [binary("prometheus-ipmi-exporter"), f"--config.file={config}", f"--freeipmi.path={freeipmi}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with serving(argv, port, "/", "ipmi_exporter start", timeout) as server:
        yield server


@contextlib.contextmanager
def node_exporter(sysfs: Path, *flags: str, output: Output = "file") -> Iterator[Server]:
    """Debian's prometheus-node-exporter over a sysfs tree, once /metrics answers."""
    port = free_port()
    argv = [binary("prometheus-node-exporter"), f"--path.sysfs={sysfs}", f"--web.listen-address=127.0.0.1:{port}",
            *flags]
    with serving(argv, port, "/metrics", "node_exporter start", 20, output=output) as server:
        yield server


def node_exporter_args(procfs: Path) -> list[str]:
    """node_exporter's flags beside gpufleet: only the collectors that read the files gpufleet reads."""
    from gpufleet.alerts.node_exporter import NODE_EXPORTER_COLLECTORS, NODE_EXPORTER_FLAGS

    return [f"--path.procfs={procfs}", "--collector.disable-defaults",
            *(f"--collector.{name}" for name in NODE_EXPORTER_COLLECTORS), *NODE_EXPORTER_FLAGS]


def node_exporters(stack: contextlib.ExitStack, root: Path, targets: Path, node_targets: Path) -> list[Server]:
    """A node_exporter per simulated node over the trees a simulator run with `--node-exporter-root=root` writes,
    once it has written them, and their file_sd targets at `node_targets` with the labels the simulator gives the
    node's own target (its instance, cluster and place), as a site relabels both jobs alike."""
    groups = wait_for(lambda: targets.is_file() and json.loads(targets.read_text()), 30, "the simulator's targets")
    wait_for(lambda: all((root / g["labels"]["instance"] / "proc" / "net" / "dev").is_file() for g in groups), 30,
             "every node's trees written out")
    servers, node_groups = [], []
    for group in groups:
        node = root / group["labels"]["instance"]
        server = stack.enter_context(node_exporter(node / "sys", *node_exporter_args(node / "proc")))
        labels = {k: v for k, v in group["labels"].items() if not k.startswith("__")}
        servers.append(server)
        node_groups.append({"targets": [server.url.removeprefix("http://")], "labels": labels})
    node_targets.write_text(json.dumps(node_groups))
    return servers


@contextlib.contextmanager
def remediator(env: Mapping[str, str], *flags: str, output: Output = "file") -> Iterator[Server]:
    """`gpufleet remediate` with `flags`, its Slurm clients pointed by `env` (`SLURM_CONF`), once it answers."""
    port = free_port()
    argv = gpufleet_command("remediate", f"--web.listen-address=127.0.0.1:{port}", "--interval=1s", *flags)
    with serving(argv, port, "/healthz", "remediate start", 20, output=output, env=env) as server:
        yield server
