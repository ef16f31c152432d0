"""Start and stop the real programs tests run against: the exporter, the fleet simulator, Prometheus, Alertmanager.

Each binds 127.0.0.1 on a free port and is stopped when its context ends, however the test ends.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from helpers import FIXTURE_SYSFS, free_port, stop_process


def http(method: str, url: str, body: object = None, timeout: float = 5.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_for(check, timeout: float, what: str, process: subprocess.Popen | None = None):
    """Call `check()` every 0.25 s until it returns something truthy, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        if process is not None and process.poll() is not None:
            pytest.fail(f"{what}: process exited:\n{process.communicate()[0]}")
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout}s")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def query(url: str, promql: str) -> list[dict]:
    status, body = http("GET", f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: install Debian's {package} package (.ci/run does)")
    return path


def _ready(process: subprocess.Popen, log: IO[str], port: int, path: str, what: str, timeout: float,
           status: int = 200) -> str:
    url = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        if process.poll() is not None:
            log.seek(0)
            pytest.fail(f"{what}: process exited:\n{log.read()[-4000:]}")
        return listening(port) and http("GET", url + path, timeout=1)[0] == status

    wait_for(answering, timeout, what)
    return url


@contextlib.contextmanager
def serving(argv: list[str], port: int, ready_path: str, what: str, timeout: float,
             ready_status: int = 200) -> Iterator[str]:
    """Run `argv`, yield its URL once `ready_path` answers `ready_status`, and stop it however the block ends.

    Its output goes to a file, not a pipe: a program that logs an error per failed write or rule evaluation
    (vmagent, vmalert while their store is down) fills a pipe nobody reads within minutes and then blocks."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield _ready(process, log, port, ready_path, what, timeout, ready_status)
        finally:
            stop_process(process)


@contextlib.contextmanager
def exporter(*flags: str, gpus: int = 1) -> Iterator[str]:
    """`gpufleet exporter` with simulated GPUs over the fixture sysfs tree; yields its URL once /metrics answers."""
    port = free_port()
    argv = [sys.executable, "-m", "gpufleet", "exporter", "--gpu.backend=sim", f"--sim.gpus={gpus}",
            f"--path.sysfs={FIXTURE_SYSFS}", f"--web.listen-address=127.0.0.1:{port}", *flags]
    with serving(argv, port, "/metrics", "exporter start", 20) as url:
        yield url


@contextlib.contextmanager
def simulator(workdir: Path, *args: str, timeout: float = 30) -> Iterator[tuple[str, Path]]:
    """`gpufleet simulate` with file_sd; yields its URL and the targets file."""
    port = free_port()
    targets = workdir / "targets.json"
    argv = [sys.executable, "-m", "gpufleet", "simulate", f"--web.listen-address=127.0.0.1:{port}",
            f"--file-sd={targets}", *args]
    with serving(argv, port, "/healthz", "simulator start", timeout) as url:
        yield url, targets


def _scrape_timing(interval: str) -> dict[str, str]:
    """A scrape interval in whole seconds, and a timeout just inside it."""
    seconds = int(interval.removesuffix("s"))
    return {"scrape_interval": interval, "scrape_timeout": f"{seconds * 1000 - 100}ms"}


def prometheus_config(path: Path, targets: Path, interval: str, rules: Path | None = None,
                      alertmanager: str | None = None, job: str = "gpufleet", cluster_label: str = "cluster") -> Path:
    """A Prometheus configuration that scrapes the simulator's file_sd targets as `job`.

    The simulator names each target's cluster in a `cluster` label; with another `cluster_label`, the scrape
    configuration moves it there, as a site that names its clusters otherwise would.
    """
    scrape: dict = {"job_name": job, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}
    if cluster_label != "cluster":
        scrape["relabel_configs"] = [{"source_labels": ["cluster"], "target_label": cluster_label},
                                     {"action": "labeldrop", "regex": "cluster"}]
    config: dict = {
        "global": {**_scrape_timing(interval), "evaluation_interval": interval},
        "scrape_configs": [scrape],
    }
    if rules is not None:
        config["rule_files"] = [str(rules)]
    if alertmanager is not None:
        address = alertmanager.removeprefix("http://")
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [address]}]}]}
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def prometheus(config: Path, data: Path, port: int | None = None, web_config: Path | None = None) -> Iterator[str]:
    """Prometheus on `port` (a free one by default: pass one where its config must name its own address).

    With `web_config` (users and passwords), it is ready when it refuses an anonymous request.
    """
    port = port or free_port()
    # A year's retention: the report tests import months of history, which the default of 15 days would delete.
    argv = [binary("prometheus", "prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1y"]
    if web_config is not None:
        argv.append(f"--web.config.file={web_config}")
    with serving(argv, port, "/-/ready", "prometheus start", 60, 401 if web_config else 200) as url:
        yield url


@contextlib.contextmanager
def alertmanager(config: Path, data: Path) -> Iterator[str]:
    port, cluster_port = free_port(), free_port()
    argv = [binary("prometheus-alertmanager", "prometheus-alertmanager"), f"--config.file={config}",
            f"--storage.path={data}", f"--web.listen-address=127.0.0.1:{port}",
            f"--cluster.listen-address=127.0.0.1:{cluster_port}", "--log.level=warn"]
    with serving(argv, port, "/-/ready", "alertmanager start", 60) as url:
        yield url


@contextlib.contextmanager
def victoria_metrics(data: Path) -> Iterator[str]:
    """A single-node VictoriaMetrics that shows samples a second after they arrive (30 s by default), as rules
    evaluated eight times faster than production need."""
    port = free_port()
    argv = [binary("victoria-metrics", "victoria-metrics"), f"-storageDataPath={data}",
            f"-httpListenAddr=127.0.0.1:{port}", "-search.latencyOffset=1s", "-loggerLevel=WARN"]
    with serving(argv, port, "/health", "victoria-metrics start", 60) as url:
        yield url


@contextlib.contextmanager
def vmagent(targets: Path, interval: str, remote_write: str, data: Path,
            shard: tuple[int, int] | None = None) -> Iterator[str]:
    """vmagent scraping the simulator's file_sd targets as job `gpufleet` and writing to `remote_write` (a storage
    URL); with `shard` (its number, of how many), only the targets vmagent's cluster mode gives that member."""
    port = free_port()
    data.mkdir(parents=True, exist_ok=True)
    config = data / "vmagent.yml"
    config.write_text(yaml.safe_dump({
        "global": _scrape_timing(interval),
        "scrape_configs": [{"job_name": "gpufleet", "file_sd_configs": [{"files": [str(targets)]}]}],
    }))
    argv = [binary("vmagent", "victoria-metrics"), f"-promscrape.config={config}", "-promscrape.fileSDCheckInterval=1s",
            f"-remoteWrite.url={remote_write}/api/v1/write", f"-remoteWrite.tmpDataPath={data / 'buffer'}",
            "-remoteWrite.flushInterval=500ms", f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"]
    if shard is not None:
        argv += [f"-promscrape.cluster.memberNum={shard[0]}", f"-promscrape.cluster.membersCount={shard[1]}"]
    with serving(argv, port, "/health", "vmagent start", 60) as url:
        yield url


def scraped_instances(agent: str) -> set[str]:
    """The `instance` of every target a vmagent (or Prometheus) scrapes."""
    status, body = http("GET", f"{agent}/api/v1/targets")
    assert status == 200, body
    return {target["labels"]["instance"] for target in json.loads(body)["data"]["activeTargets"]}


@contextlib.contextmanager
def vmalert(rules: Path, storage: str, alertmanager: str, interval: str, lookback: str = "5m",
            port: int | None = None) -> Iterator[str]:
    """vmalert evaluating `rules` against `storage`, writing recorded series and alert state back to it (and
    restoring that state from it after a restart), and notifying `alertmanager`.

    `interval` is what Prometheus's `evaluation_interval` would be (the scrape interval): the groups without
    their own interval run at it, where vmalert's default is a minute. Its `alertgroup` label is left off:
    the alerts then carry the labels Prometheus gives the same rules, and Alertmanager groups them alike.
    `lookback` is how long a series that stopped keeps its last value in a query (`-datasource.queryStep`,
    which VictoriaMetrics takes as the window of a bare selector), as Prometheus's lookback delta: 5m in
    both by default, but VictoriaMetrics 1.79 has no staleness markers to end a vanished target's series
    sooner. Pass the `port` of a vmalert that was stopped to restart it where its clients look for it.
    """
    port = port or free_port()
    argv = [binary("vmalert", "victoria-metrics"), f"-rule={rules}", f"-evaluationInterval={interval}",
            f"-datasource.url={storage}", f"-remoteWrite.url={storage}", f"-remoteRead.url={storage}",
            "-remoteWrite.flushInterval=500ms", f"-notifier.url={alertmanager}", "-disableAlertgroupLabel",
            f"-datasource.queryStep={lookback}",
            f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"]
    with serving(argv, port, "/health", "vmalert start", 60) as url:
        yield url
