"""CI's short run of the detection benchmark (`bench/detection_bench.py --short`), in the real programs.

Jobs of 4 and 8 nodes; after a healthy spell, a 20 % clock straggler in the first and a 20 % NIC
straggler in the second. Both must be found with their cause named, and nothing else may fire.
The full sweep (causes, sizes, job sizes, seeds) runs outside CI; its table is in the README.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench" / "detection_bench.py"
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_the_short_sweep_finds_both_stragglers_with_their_cause_and_no_false_alert():
    result = subprocess.run([sys.executable, str(BENCH), "--short"], capture_output=True, text=True, timeout=600)
    verdict = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    assert verdict == {"found_and_named": True, "false_alerts": 0}, result.stdout + result.stderr
    assert result.returncode == 0
