"""Property-based tests: arbitrary input to every parser either parses or is refused; nothing else escapes.

Parsers under test: sysfs files (through the collectors, over an in-memory tree), cgroup files, kernel
log lines, the pod-resources protobuf decoder, scenario files and web configuration files.
"""

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.exporter.collector.hwmon import HwmonCollector
from gpufleet.exporter.collector.infiniband import InfinibandCollector
from gpufleet.exporter.collector.network import NetworkCollector
from gpufleet.exporter.gpu.jobs import job_from_cgroup
from gpufleet.exporter.gpu.podresources import gpu_pods
from gpufleet.exporter.gpu.xid import parse_xid_line
from gpufleet.exporter.sxid import CLASSES, parse_sxid
from gpufleet.exporter.tree import MemoryTree
from gpufleet.exporter.webconfig import WebConfigError, load
from gpufleet.simulator.faults import ScenarioError, load_scenario

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
contents = st.one_of(st.text(max_size=60), st.from_regex(r"-?[0-9]{1,25}", fullmatch=True),
                     st.sampled_from(["", "0x", "4: ACTIVE", "400 Gb/sec (4X NDR)", "-1", "1e9", "\x00", "NaN"]))


@FAST
@given(values=st.lists(contents, min_size=12, max_size=12))
def test_collectors_survive_any_file_content(values):
    tree = MemoryTree()
    names = iter(values)
    for path in ("class/net/eth0/statistics/rx_bytes", "class/net/eth0/speed", "class/net/eth0/operstate",
                 "class/net/eth0/mtu", "class/infiniband/mlx5_0/ports/1/rate",
                 "class/infiniband/mlx5_0/ports/1/state", "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data",
                 "class/infiniband/mlx5_0/ports/1/counters_ext/port_rcv_data_64",
                 "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer", "class/hwmon/hwmon0/temp1_input",
                 "class/hwmon/hwmon0/temp1_label", "class/hwmon/hwmon0/fan1_input"):
        tree.set(path, next(names))
    for collector in (NetworkCollector(tree, exclude=None), InfinibandCollector(tree), HwmonCollector(tree)):
        collection = collector.collect()
        for family in collection.families:
            for sample in family.samples:
                assert isinstance(sample.value, (int, float))
        assert all(isinstance(problem, str) for problem in collection.problems)


@FAST
@given(st.text(max_size=400))
def test_cgroup_parser(text):
    job = job_from_cgroup(text)
    assert job is None or job.scheduler in {"slurm", "kubernetes", "docker"}


@FAST
@given(st.text(max_size=300))
def test_kernel_log_parser(line):
    parsed = parse_xid_line(line)
    assert parsed is None or (len(parsed[0]) == 3 and parsed[1] >= 0)
    sxid = parse_sxid(line)
    assert sxid is None or (sxid.code >= 0 and sxid.error_class in CLASSES.values())


@FAST
@given(st.binary(max_size=300))
def test_protobuf_decoder(raw):
    try:
        gpu_pods(raw)
    except ValueError:
        pass  # Refused as malformed; the client turns that into PodResourcesUnavailable.


class _Node:
    ports = ("mlx5_0/1", "eth0")


@FAST
@given(st.one_of(st.text(max_size=300), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20).map(repr)))
def test_scenario_parser(text):
    try:
        load_scenario(text, {"gpu-node-0001": _Node()}, 8, itertools.count(1))
    except ScenarioError:
        pass


@FAST
@given(st.text(max_size=300))
def test_web_config_parser(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(text)
    try:
        load(path)
    except WebConfigError:
        pass
