"""The golden exposition: what a node serves on /metrics, committed and diffed, as node_exporter's e2e-output.txt.

`gpufleet.devtools.nodes` builds it with the exporter's own code (see there). Every change of a metric name,
label, HELP text or value then shows up as a diff of tests/fixtures/e2e-output.txt in review. After a change
that is meant, regenerate it with everything else that is generated, and commit it with the change:

    .venv/bin/python -m gpufleet.devtools generate
"""

from __future__ import annotations

from gpufleet.devtools.nodes import GOLDEN, golden_exposition


def test_the_exposition_is_the_committed_one() -> None:
    assert golden_exposition() == GOLDEN.read_text(), (
        "/metrics changed; if that is meant, run `.venv/bin/python -m gpufleet.devtools generate` and commit "
        "tests/fixtures/e2e-output.txt with the change")
