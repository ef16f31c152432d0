"""The exporter's text writer produces exactly what prometheus_client's generate_latest produces."""

from prometheus_client import ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector.infiniband import InfinibandCollector
from gpufleet.exporter.collector.network import NetworkCollector
from gpufleet.exporter.render import render
from gpufleet.exporter.tree import DiskTree


class Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def test_byte_for_byte_the_same_as_prometheus_client():
    odd = GaugeMetricFamily("odd_values", 'Help with a \\ backslash\nand a newline.', labels=("label", "zone"))
    odd.add_metric(['quote " backslash \\ newline \n', "b"], 1.5)
    odd.add_metric(["", "z"], float("inf"))
    odd.add_metric(["x", "y"], float("nan"))
    counter = CounterMetricFamily("events_total", "Events.", labels=("kind",))
    counter.add_metric(["a"], 12345678901234.0)
    mixed = GaugeMetricFamily("mixed_info", "Series with differing label sets.")
    mixed.add_sample("mixed_info", {"b": "2", "a": "1"}, 1.0)
    mixed.add_sample("mixed_info", {"only": "one"}, 1.0)
    plain = GaugeMetricFamily("no_labels", "No labels.", value=-0.0001)
    families = [odd, counter, mixed, plain, *ProcessCollector(registry=None).collect(),
                *NetworkCollector(DiskTree(FIXTURE_SYSFS)).collect().families,
                *InfinibandCollector(DiskTree(FIXTURE_SYSFS)).collect().families]
    assert render(families) == generate_latest(Families(families))
