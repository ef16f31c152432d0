"""`gpufleet exporter --path.state` as a process: what it keeps survives kill -9, and a state file it cannot
use (truncated, another host's, in a read-only directory) costs one log line and a metric, never a scrape.

XIDs reach the exporter the way the kernel reports them: lines appended to the log it follows
(`--path.kmsg`), naming the simulated boards' PCI addresses. The exporter counts one once NVML has had ten
seconds to report it too (it does not here), so each wait allows twenty.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpufleet.devtools.net import free_port
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.devtools.processes import stop as stop_process
from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter.state import FILE

from helpers import named, parse, series

pytestmark = pytest.mark.e2e

XID_62 = "NVRM: Xid (PCI:0000:18:00): 62, pid=1234, name=python, Ch 00000008\n"  # GPU 0 of the simulated node.


class Exporter:
    """One exporter process over a state directory and a kernel log, started and killed at will."""

    def __init__(self, state: Path, kmsg: Path, wrap: tuple[str, ...] = ()) -> None:
        self.state, self.kmsg, self.wrap = state, kmsg, wrap
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.process = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "gpufleet", "exporter", "--gpu.backend=sim", "--sim.gpus=2",
             f"--path.sysfs={FIXTURE_SYSFS}", f"--path.state={self.state}", "--collector.gpu.xid-kmsg",
             f"--path.kmsg={self.kmsg}", "--collector.gpu.interval=1s", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: self.scrape().get(series("gpufleet_collector_success", collector="gpu")) == 1, 15,
                 "the GPU collector's first success", self.process)

    def scrape(self) -> dict:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as response:
                return parse(response.read())
        except OSError:
            return {}

    def output(self) -> str:
        assert self.process is not None
        stop_process(self.process)
        return self.process.stdout.read() if self.process.stdout else ""

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def exporter(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    (tmp_path / "state").mkdir()
    node = Exporter(tmp_path / "state", kmsg)
    yield node
    if node.process is not None and node.process.poll() is None:
        stop_process(node.process)


def xids(samples: dict) -> float:
    return sum(named(samples, "gpufleet_gpu_xid_errors_total").values())


def test_kill_9_between_two_xids_loses_neither_nor_the_held_reset(exporter):
    exporter.start()
    with exporter.kmsg.open("a") as log:
        log.write(XID_62)
    kept = exporter.state / FILE
    wait_for(lambda: kept.exists() and '"xid":62' in kept.read_text(), 20, "the XID in the state file")
    exporter.kill()
    exporter.start()
    with exporter.kmsg.open("a") as log:
        log.write(XID_62)
    samples = wait_for(lambda: (s := exporter.scrape()) and xids(s) == 2 and s, 20, "both XIDs counted")
    actions = named(samples, "gpufleet_gpu_recovery_action")
    assert sorted(actions.values()) == [0.0, 2.0]  # GPU 0 still needs its reset; GPU 1 nothing.
    assert samples[series("gpufleet_exporter_state_ok", operation="load")] == 1
    assert samples[series("gpufleet_exporter_state_ok", operation="save")] == 1
    assert samples[series("gpufleet_exporter_state_ignored_entries")] == 0


def test_a_truncated_state_file_is_one_line_and_a_metric_and_then_replaced(exporter):
    (exporter.state / FILE).write_text('{"version": 1, "sections": {"gpu": {"xids": [{"uu')
    exporter.start()
    samples = exporter.scrape()
    assert samples[series("gpufleet_exporter_state_ok", operation="load")] == 0
    wait_for(lambda: json.loads((exporter.state / FILE).read_text() or "null") is not None, 10, "a new state file")
    output = exporter.output()
    assert output.count("is not valid JSON") == 1, output
    assert "Traceback" not in output


def test_another_hosts_state_file_is_not_applied(exporter, tmp_path):
    foreign = {"version": 1, "sections": {"gpu": {
        "xids": [{"uuid": "GPU-77777777-0000-0000-0000-000000000000", "xid": 79, "count": 3, "last": 1.0}],
        "actions": {"00000000:18:00.0": {"uuid": "GPU-77777777-0000-0000-0000-000000000000", "action": 3,
                                         "reason": "XID 79", "since": 1.0, "boot": 1.0}}}}}
    (exporter.state / FILE).write_text(json.dumps(foreign))
    exporter.start()
    samples = wait_for(lambda: (s := exporter.scrape()) and named(s, "gpufleet_gpu_recovery_action") and s, 10,
                       "the recovery actions")
    assert xids(samples) == 0
    assert set(named(samples, "gpufleet_gpu_recovery_action").values()) == {0.0}
    assert samples[series("gpufleet_exporter_state_ok", operation="load")] == 1
    assert samples[series("gpufleet_exporter_state_ignored_entries")] == 2


def test_a_read_only_state_directory_keeps_the_exporter_serving(tmp_path):
    """The directory is made read-only by a bind mount in a user namespace of its own, since root, who runs
    CI, writes through file modes."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -rm (user and mount namespaces) to make a read-only directory")
    state, kmsg = tmp_path / "state", tmp_path / "kmsg"
    state.mkdir()
    kmsg.touch()
    remount = f"mount --bind {state} {state} && mount -o remount,bind,ro {state} && exec \"$0\" \"$@\""
    exporter = Exporter(state, kmsg, (unshare, "-rm", "sh", "-c", remount))
    exporter.start()
    try:
        with kmsg.open("a") as log:
            log.write(XID_62)
        samples = wait_for(lambda: (s := exporter.scrape()) and xids(s) == 1 and s, 20, "the XID counted")
        assert samples[series("gpufleet_exporter_state_ok", operation="save")] == 0
        assert sorted(named(samples, "gpufleet_gpu_recovery_action").values()) == [0.0, 2.0]
    finally:
        output = exporter.output()
    assert output.count("Read-only file system") == 1, output
    assert not (state / FILE).exists()
