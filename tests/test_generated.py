"""Everything generated from the code is committed as generated: the rules, the dashboards, the golden exposition
and the reference pages. A change that is not regenerated fails here, naming the file and the command."""

from __future__ import annotations

import pytest
import yaml

from gpufleet.devtools.generate import ARTIFACTS, generate, stale
from gpufleet.devtools.nodes import SERIES_BUDGET, bench_node, series_by_family
from gpufleet.devtools.paths import ROOT
from gpufleet.devtools.reference import alerts, metrics


def test_every_generated_file_is_current() -> None:
    assert generate(ROOT, check=True) == [], "run `python -m gpufleet.devtools generate` and commit the result"


def _artifact(name: str):
    return next(a for a in ARTIFACTS if a.name == name)


def test_a_metric_added_without_regenerating_makes_the_metric_reference_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    served = bench_node()
    extra = "# HELP gpufleet_gpu_spare_ratio A family no one has documented.\n# TYPE gpufleet_gpu_spare_ratio gauge\n" \
            'gpufleet_gpu_spare_ratio{gpu="0",uuid="GPU-0"} 0.5\n'
    monkeypatch.setattr(metrics, "bench_node", lambda flags=None: served + extra)
    artifact = _artifact("metrics")
    assert stale(ROOT, artifact, artifact.render()) == ["docs/reference/metrics.md"]
    assert "gpufleet_gpu_spare_ratio" in artifact.render()["docs/reference/metrics.md"]


def test_an_alert_added_without_regenerating_makes_the_alert_reference_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = yaml.safe_load(alerts.render(alerts.Config()))
    rules["groups"][0]["rules"].append({"alert": "GpuSpareAlert", "expr": "vector(1)", "labels": {"severity": "info"},
                                        "annotations": {"summary": "An alert no one has documented."}})
    monkeypatch.setattr(alerts, "render", lambda config: yaml.safe_dump(rules))
    artifact = _artifact("alerts")
    assert stale(ROOT, artifact, artifact.render()) == ["docs/reference/alerts.md"]


def test_a_dashboard_left_over_from_one_that_is_gone_is_stale(tmp_path) -> None:
    artifact = _artifact("dashboards")
    files = artifact.render()
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "dashboards" / "json" / "gpufleet-gone.json").write_text("{}")
    assert stale(tmp_path, artifact, files) == ["dashboards/json/gpufleet-gone.json"]


def test_an_eight_gpu_node_stays_inside_the_series_budget() -> None:
    assert sum(series_by_family(bench_node()).values()) <= SERIES_BUDGET
