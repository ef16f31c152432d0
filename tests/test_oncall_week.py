"""CI's on-call week (`bench/oncall_week.py --short`), in the real programs: 16 nodes at time scale 16 for 45
production minutes.

Five fault kinds, each on a node of its own: the four that need a person now (XID 79, a double-bit ECC error, a lost
GPU, a port down) open one pager incident each, the failed row remap none (it tickets). Planned work, done as the
runbooks say, pages nobody: every exporter restarted, a driver upgrade of two nodes drained for it in Slurm (NVML
gone as a whole, then a reboot into another driver), a node drained for an RMA and powered off, Prometheus
restarted, a leaf switch down under a `gpufleet maintenance` silence of the leaf, a GPU removed under a silence of
its node. A GPU that does not come back from a node's BIOS update pages once the node is resumed, and not before.
No page resolves while its fault holds. The full week (250 nodes, the Llama 3 profile's draws, hours-long spans)
runs outside CI; its figures are in bench/results/.
"""

from __future__ import annotations

import pytest

from gpufleet.devtools import oncall, oncall_judge, oncall_run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_planned_work_pages_nobody_and_each_real_fault_pages_once():
    week = oncall.short()
    the_plan, running, receiver, ended = oncall_run.run(week)
    judged = oncall_judge.judge(the_plan.faults, the_plan.works, running, receiver, ended)
    table = oncall_judge.report(judged, running)
    print(table)
    pages = {(oncall_judge.label(v.fault), v.fault.cause): len(v.incidents) for v in judged.verdicts}
    assert pages == {("xid 79", "every kind"): 1, ("ecc_dbe", "every kind"): 1, ("gpu_lost", "every kind"): 1,
                     ("ib_link_down", "every kind"): 1, ("row_remap_failure", "every kind"): 0,
                     ("gpu_dead", "a fault under maintenance"): 1}, table
    assert judged.planned_pages == [] and judged.other_pages == [], table
    assert sum(v.resolved_early for v in judged.verdicts) == 0, table
    [under_maintenance] = [v for v in judged.verdicts if v.fault.returns is not None]
    assert under_maintenance.paged is not None and under_maintenance.paged >= 0, table
    assert all(v.reached for v in judged.verdicts), table
