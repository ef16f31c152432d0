"""CI's short run of the detection sweep (`bench/detection_bench.py --short`), in the real programs.

Jobs of 4 and 8 nodes, two with an InfiniBand port never cabled; after a healthy spell, a 20 % clock
straggler in the first and a 20 % NIC straggler in the second. Both must be found with their cause named,
and nothing else may fire or page. The pages of the fault kinds are CI's on-call week's
(tests/test_oncall_week.py). The full sweep (causes, sizes, job sizes, seeds) runs outside CI; its figures are
in bench/results/.
"""

from __future__ import annotations

import pytest

from gpufleet.devtools.detection import run, short

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_the_short_sweep_finds_both_stragglers_with_no_false_alert_or_page():
    outcome = run(short())
    print(outcome.table())
    assert [(str(c.cause), c.detected is not None, c.named) for c in outcome.cases] == [
        ("clock", True, True), ("nic", True, True)], outcome.table()
    assert outcome.tally.false == [], outcome.table()
    assert outcome.false_pages == [], outcome.table()
