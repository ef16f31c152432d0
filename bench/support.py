"""What every benchmark here needs to start a server on loopback and wait for it, in one place.

The scripts run as `python bench/NAME.py`, which puts this folder on sys.path.
"""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

QUERY_STEP = "300s"  # vmalert's -datasource.queryStep default, which the compose file keeps.
COMPOSE = yaml.safe_load((Path(__file__).resolve().parent.parent / "compose" / "docker-compose.yml").read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def binary(name: str, package: str) -> str:
    """The path of a program the benchmark runs, or an exit that says which Debian package has it."""
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} not found: apt-get install {package}")
    return path


def wait_ready(url: str, process: subprocess.Popen, seconds: float = 20) -> None:
    """Until `url` answers 200; exits the benchmark if the process dies or the time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args[0]} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {seconds}s")


def simulator_command(niceness: int) -> list[str]:
    """`gpufleet simulate`, at `niceness` where it is not 0: the simulator and every thread it starts then
    yield the CPU to the servers under test, as the fleet it stands for would on machines of its own.
    nice(1) execs, so the process's pid is the simulator's."""
    return [*(["nice", "-n", str(niceness)] if niceness else []), sys.executable, "-m", "gpufleet", "simulate"]


def start_simulator(nodes: int, targets: Path, collect_seconds: int, niceness: int = 0) -> subprocess.Popen:
    """The simulator with `nodes` nodes of 8 GPUs, its targets written to `targets`, once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [*simulator_command(niceness), f"--nodes={nodes}", f"--file-sd={targets}",
         f"--web.listen-address=127.0.0.1:{port}", f"--collect-interval={collect_seconds}s", "--log.level=warn"])
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", process, 300)
    except BaseException:
        stop(process)
        raise
    return process


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def query(prometheus: str, promql: str, timeout: float = 10.0) -> float | None:
    """The first value of an instant query, or None when it returns nothing."""
    body = json.loads(get(f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}", timeout))
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def status_mib(pid: int) -> dict[str, float]:
    """The memory fields of /proc/PID/status (VmHWM, VmRSS, RssAnon, RssFile, ...), in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.endswith(" kB"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def peak_rss_mib(pid: int) -> float:
    peak = status_mib(pid).get("VmHWM")
    return peak if peak is not None else psutil.Process(pid).memory_info().rss / 2**20


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def stop(process: subprocess.Popen, seconds: float = 60) -> None:
    """SIGTERM, so a server can flush its storage; SIGKILL if it has not ended within `seconds`."""
    process.terminate()
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


class VmalertIterations:
    """Each rule group's evaluations in a running vmalert, from the sums and counts of its own
    `vmalert_iteration_duration_seconds`: vmalert keeps no last duration per group as Prometheus does, and
    its summary's quantiles cover a sliding window. Read more often than the shortest interval, each new
    count is one evaluation and the sum's step its duration, ended by the time of the read (`ended`, the
    clock's seconds, within one read's period)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.durations: dict[str, list[float]] = {}
        self.ended: dict[str, list[float]] = {}
        self.first = self.last = self._totals()

    def _totals(self) -> dict[tuple[str, str], float]:
        totals: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(get(f"{self.url}/metrics", 30).decode()):
            for sample in family.samples:
                if sample.name.startswith(("vmalert_iteration_", "vmalert_execution_errors_total")):
                    key = (sample.name, sample.labels.get("group", ""))
                    totals[key] = totals.get(key, 0.0) + sample.value
        return totals

    def sample(self) -> None:
        now, at = self._totals(), time.time()
        for (name, group), count in now.items():
            if name == "vmalert_iteration_duration_seconds_count" and group:
                runs = count - self.last.get((name, group), 0.0)
                spent = now[("vmalert_iteration_duration_seconds_sum", group)] - self.last.get(
                    ("vmalert_iteration_duration_seconds_sum", group), 0.0)
                if runs > 0:
                    self.durations.setdefault(group, []).extend([spent / runs] * int(runs))
                    self.ended.setdefault(group, []).extend([at] * int(runs))
        self.last = now

    def since_start(self, name: str, group: str = "") -> float:
        """How much a counter of vmalert's (missed iterations, failed executions) grew while it was sampled."""
        return self.last.get((name, group), 0.0) - self.first.get((name, group), 0.0)


def compose_flags(service: str, dropped: tuple[str, ...]) -> list[str]:
    """The service's compose flags, less those the bench sets itself, with compose's defaults for ${VAR:-x}."""
    flags = []
    for arg in COMPOSE["services"][service]["command"]:
        if not arg.startswith(dropped):
            name, _, value = arg.partition("=")
            if "${" in value:
                value = value.split(":-", 1)[1].rstrip("}")
            flags.append(f"{name}={value}" if value else name)
    return flags


def serve(argv: list[str], port: int, ready: str = "/health") -> tuple[subprocess.Popen, str]:
    """Start a server quietly and return it with its URL once `ready` answers."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + ready, process, 120)
    return process, url


def percentile(values: list[float], share: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


def serve_victoriametrics(storage: Path, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """A single-node VictoriaMetrics on fresh `storage`, with the compose file's flags and `extra`."""
    port = free_port()
    return serve([binary("victoria-metrics", "victoria-metrics"), f"-storageDataPath={storage}",
                  f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=ERROR",
                  *compose_flags("victoriametrics", ("-storageDataPath", "-httpListenAddr")), *extra], port)


def serve_alertmanager(workdir: Path) -> tuple[subprocess.Popen, str]:
    """An Alertmanager that routes every alert nowhere: vmalert needs one to notify, the benches no pages."""
    routing = workdir / "alertmanager.yml"
    routing.write_text("route: {receiver: nowhere}\nreceivers: [{name: nowhere}]\n")
    port = free_port()
    return serve([binary("prometheus-alertmanager", "prometheus-alertmanager"), f"--config.file={routing}",
                  f"--storage.path={workdir / 'alertmanager'}", f"--web.listen-address=127.0.0.1:{port}",
                  f"--cluster.listen-address=127.0.0.1:{free_port()}", "--log.level=warn"], port, "/-/ready")


def serve_vmalert(rules: Path, vm_url: str, am_url: str) -> tuple[subprocess.Popen, str]:
    """vmalert over `rules`, reading from and writing to VictoriaMetrics, with the compose file's other flags."""
    port = free_port()
    return serve([binary("vmalert", "victoria-metrics"), f"-rule={rules}", f"-datasource.url={vm_url}",
                  f"-remoteWrite.url={vm_url}", f"-remoteRead.url={vm_url}", f"-notifier.url={am_url}",
                  f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=ERROR",
                  *compose_flags("vmalert", ("-rule", "-datasource.url", "-remoteWrite.url", "-remoteRead.url",
                                             "-notifier.url", "-httpListenAddr", "-external.url"))], port)


def rule_times(vm_url: str, groups: dict, at: float, runs: int = 3) -> list[tuple[float, str, str]]:
    """Each rule's median query time at `at`, slowest first, with its group and name: its expression asked
    as vmalert asks it (an instant query with vmalert's step), which says where a group's time goes."""
    times = []
    for group in groups["groups"]:
        for rule in group["rules"]:
            params = urllib.parse.urlencode({"query": rule["expr"], "time": f"{at:.0f}", "step": QUERY_STEP})
            seen = []
            for _ in range(runs):
                began = time.monotonic()
                get(f"{vm_url}/api/v1/query?{params}", 120)
                seen.append(time.monotonic() - began)
            if "record" in rule:  # A recording rule's labels tell its rules apart (a cause, a signal).
                labels = ",".join(f'{k}="{v}"' for k, v in rule.get("labels", {}).items())
                name = rule["record"] + (f"{{{labels}}}" if labels else "")
            else:
                name = rule["alert"]
            times.append((sorted(seen)[runs // 2], group["name"], name))
    return sorted(times, reverse=True)
