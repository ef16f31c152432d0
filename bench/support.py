"""What every benchmark here needs to start a server on loopback and wait for it, in one place.

The scripts run as `python bench/NAME.py`, which puts this folder on sys.path.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil


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


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def query(prometheus: str, promql: str, timeout: float = 10.0) -> float | None:
    """The first value of an instant query, or None when it returns nothing."""
    body = json.loads(get(f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}", timeout))
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return psutil.Process(pid).memory_info().rss / 2**20


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
