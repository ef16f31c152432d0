"""`gpufleet exporter` as a user runs it: a subprocess on 127.0.0.1, scraped over HTTP, checked by promtool."""

import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from gpufleet.devtools.net import free_port
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.devtools.processes import stop as stop_process
from gpufleet.devtools.programs import binary
from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter.node import COLLECTORS

from helpers import named, nvml_present, parse, series

pytestmark = pytest.mark.e2e


def gpufleet(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpufleet", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.read()


@pytest.fixture
def kmsg(tmp_path):
    """A kernel log that holds a message from before the exporter started, which it must not count."""
    path = tmp_path / "kmsg"
    path.write_text("4,101,5000000,-;watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [python3:1]\n")
    return path


@pytest.fixture
def exporter(kmsg):
    port = free_port()
    process = gpufleet("exporter", "--gpu.backend=sim", "--sim.gpus=8", f"--path.sysfs={FIXTURE_SYSFS}",
                       f"--web.listen-address=127.0.0.1:{port}", "--collector.gpu.interval=1s",
                       "--collector.gpu.slow-interval=2s", "--collector.gpu.counter-interval=2s", f"--path.kmsg={kmsg}",
                       "--collector.kernel.interval=1s")
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            success = named(parse(get(f"{url}/metrics")), "gpufleet_collector_success")
        except OSError:
            return False
        return len(success) == len(COLLECTORS) and set(success.values()) == {1}

    try:
        wait_for(ready, 15, "every collector's first success", process)
        yield process, url
    finally:
        stop_process(process)


def test_scrape_has_every_collector_and_exact_fixture_values(exporter):
    _, url = exporter
    samples = parse(get(f"{url}/metrics"))
    assert {dict(l)["collector"] for l in named(samples, "gpufleet_collector_success")} == {
        "gpu", "network", "infiniband", "hwmon", "pcie", "thermal_zone", "kernel"}
    assert samples[series("gpufleet_gpu_devices")] == 8
    assert len(named(samples, "gpufleet_gpu_info")) == 8
    for name in ("gpufleet_gpu_utilization_ratio", "gpufleet_gpu_power_watts", "gpufleet_gpu_energy_joules_total",
                 "gpufleet_gpu_temperature_celsius", "gpufleet_gpu_memory_used_bytes"):
        assert len(named(samples, name)) == 8, name
    for labels, watts in named(samples, "gpufleet_gpu_power_watts").items():
        assert 0 < watts <= samples[("gpufleet_gpu_power_limit_watts", labels)]
    assert not named(samples, "gpufleet_gpu_fan_speed_ratio")  # The simulated SXM boards have no fans.
    # The simulated processes go through the real attribution path: half a Slurm job, half a Kubernetes pod.
    schedulers = sorted(dict(l)["scheduler"] for l in named(samples, "gpufleet_gpu_job_info"))
    assert schedulers == ["kubernetes"] * 4 + ["slurm"] * 4
    assert set(named(samples, "gpufleet_gpu_processes").values()) == {1}
    assert samples[series("gpufleet_infiniband_port_xmit_data_bytes_total", device="mlx5_0", port="1")] == (
        123456789012345 * 4)
    assert samples[series("gpufleet_network_receive_bytes_total", device="eno1")] == 9876543210123
    assert samples[series("gpufleet_hwmon_temperature_celsius", chip="k10temp", device="0000:00:18.3",
                          sensor="temp1", label="Tctl")] == 52.375
    assert samples[series("gpufleet_thermal_zone_temperature_celsius", zone="thermal_zone0", type="x86_pkg_temp")] == 46
    # GPU 0's link: 3 errors at the GPU and 40 at the root port above it, which it is linked below in the fixture.
    assert {dict(l)["type"]: v for l, v in named(samples, "gpufleet_pcie_aer_errors_total").items()
            if dict(l)["address"] == "0000:18:00"} == {"correctable": 43, "nonfatal": 1, "fatal": 0}
    assert any(name == "gpufleet_exporter_build_info" for name, _ in samples)
    assert samples[series("process_open_fds")] > 0


def test_promtool_finds_nothing_to_complain_about(exporter):
    _, url = exporter
    promtool = binary("promtool")
    body = get(f"{url}/metrics")
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result


def test_energy_counter_keeps_rising_between_collections(exporter):
    _, url = exporter

    def energy() -> dict:
        return named(parse(get(f"{url}/metrics")), "gpufleet_gpu_energy_joules_total")

    first = energy()
    second = wait_for(lambda: (now := energy()) != first and now, 10, "a later GPU collection")
    assert first.keys() == second.keys()
    assert all(second[gpu] > first[gpu] for gpu in first)


def test_kernel_messages_written_after_the_start_are_counted_by_event(exporter, kmsg):
    _, url = exporter
    with kmsg.open("a") as log:
        log.write("4,102,6000000,-;watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python3:48213]\n"
                  " SUBSYSTEM=cpu\n"  # A continuation line of /dev/kmsg's: not a message.
                  "3,103,6100000,-;Out of memory: Killed process 48213 (python3) total-vm:812kB\n"
                  "6,104,6200000,-;nfs: server home not responding, still trying\n"
                  "3,108,6250000,-;Lustre: lustre1-OST0003-osc-ffff88103c2f8000: Connection to lustre1-OST0003 (at "
                  "10.0.0.5@o2ib) was lost; in progress operations using this service will wait for recovery\n"
                  "6,105,6300000,-;eth0: link up\n"
                  # Written by a process (facility user), not the kernel: not counted, whatever it says.
                  "12,106,6400000,-;Out of memory: Killed process 1 (init)\n"
                  "3,107,6500000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 28 sourcetrack "
                  "timeout error (First)\n")

    def events() -> dict[str, float] | None:
        found = {dict(labels)["event"]: value
                 for labels, value in named(parse(get(f"{url}/metrics")), "gpufleet_kernel_events_total").items()}
        return found if found.get("storage_timeout") == 2 else None

    assert wait_for(events, 10, "the kernel messages counted") == {
        "soft_lockup": 1, "hung_task": 0, "storage_timeout": 2, "machine_check": 0, "oom_kill": 1}
    samples = parse(get(f"{url}/metrics"))
    assert samples[series("gpufleet_kernel_log_readable")] == 1
    assert named(samples, "gpufleet_kernel_storage_timeouts_total") == {
        frozenset({("server", "home")}): 1, frozenset({("server", "lustre1-OST0003")}): 1}
    assert named(samples, "gpufleet_nvswitch_sxid_errors_total") == {
        frozenset({("switch", "0000:05:00.0"), ("sxid", "24007"), ("class", "fatal")}): 1}


def test_an_unreadable_kernel_log_is_said_once_and_fails_nothing(tmp_path):
    port = free_port()
    process = gpufleet("exporter", "--gpu.backend=sim", f"--path.sysfs={FIXTURE_SYSFS}",
                       f"--web.listen-address=127.0.0.1:{port}", f"--path.kmsg={tmp_path / 'absent'}",
                       "--collector.kernel.interval=200ms")
    url = f"http://127.0.0.1:{port}"
    try:
        samples = wait_for(lambda: _scraped(url, "gpufleet_kernel_log_readable"), 15, "the kernel collector")
        assert samples[series("gpufleet_kernel_log_readable")] == 0
        assert samples[series("gpufleet_collector_success", collector="kernel")] == 1
        time.sleep(1)  # Several collections, each failing to open the log.
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert output.count("kernel log unreadable: No such file or directory") == 1, output


def _scraped(url: str, name: str) -> dict | None:
    try:
        samples = parse(get(f"{url}/metrics"))
    except OSError:
        return None
    return samples if named(samples, name) else None


def test_sigterm_stops_it_cleanly(exporter):
    process, _ = exporter
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=10)
    assert process.returncode == 0
    assert 'msg="shutting down"' in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--collector.gpu.interval=often"], 2, "invalid duration 'often'"),
        (["--web.listen-address=localhost"], 2, "invalid listen address 'localhost'"),
        (["--web.listen-address=:0"], 2, "invalid listen address ':0'"),
        (["--gpu.backend=sim", "--sim.gpus=0"], 2, "count '0' must be at least 1"),
        (["--collector.network.device-exclude=("], 2, "invalid regular expression"),
        (["--gpu.backend=cuda"], 2, "invalid choice: 'cuda'"),
        (["--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
        (["--gpu.backend=sim", "--job.pod-pattern=(?P<job>.+)-w"], 1,
         "--job.pod-pattern reads pod names, which need --job.pod-resources"),
        (["--gpu.backend=sim", "--job.pod-resources", "--job.pod-pattern=(.+)-w"], 1,
         "--job.pod-pattern '(.+)-w': needs a group named job"),
        (["--gpu.backend=sim", "--job.pod-resources", "--job.pod-pattern=(?P<job>"], 1,
         "--job.pod-pattern '(?P<job>': not a regular expression"),
        (["--gpu.backend=sim", "--collector.gpu.interval=5s", "--collector.gpu.timeout=10s"], 1,
         "--collector.gpu.timeout (10s) must not exceed --collector.gpu.interval (5s)"),
    ],
)
def test_bad_flags_get_a_clear_message_and_no_traceback(args, code, message):
    process = gpufleet("exporter", *args)
    output, _ = process.communicate(timeout=20)
    assert process.returncode == code
    assert message in output
    assert "Traceback" not in output


def test_a_port_already_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = gpufleet("exporter", "--gpu.backend=sim", f"--path.sysfs={FIXTURE_SYSFS}",
                           f"--web.listen-address=127.0.0.1:{port}")
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in output
    assert "Traceback" not in output


@pytest.mark.skipif(nvml_present(), reason="this machine has an NVIDIA driver")
def test_nvml_backend_without_a_driver_refuses_to_start():
    process = gpufleet("exporter", "--gpu.backend=nvml", f"--web.listen-address=127.0.0.1:{free_port()}")
    output, _ = process.communicate(timeout=20)
    assert process.returncode == 1
    assert "--gpu.backend=nvml needs a working NVML" in output
