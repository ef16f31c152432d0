"""NVIDIA's XID catalog, reduced to what an operator must do about each code.

The one table of XID classes: the rules and dashboards match on it, and the simulator raises the
codes named here for the faults that cause them.
"""

from __future__ import annotations

# Codes that name a specific hardware failure, raised by the simulator's faults of the same kind.
DOUBLE_BIT_ECC = 48
ROW_REMAP_FAILURE = 64
FALLEN_OFF_BUS = 79

# Codes after which the GPU must be reset or the node rebooted (page).
RESET_OR_REBOOT = (DOUBLE_BIT_ECC, 62, ROW_REMAP_FAILURE, 74, FALLEN_OFF_BUS, 95, 109, 119, 120, 136, 140, 143,
                   *range(144, 151), 155, 156, 158)
# Recorded by the driver, worth a ticket: row remap event, high single-bit rate, contained memory error.
WATCH = (63, 92, 94)
# The application's own fault (illegal address, MMU fault, ...): information, a ticket when repeated.
APPLICATION = (13, 31, 43, 45)
CLASSES = {"reset or reboot": RESET_OR_REBOOT, "watch": WATCH, "application": APPLICATION}


def matcher(codes: tuple[int, ...]) -> str:
    """A PromQL regex matcher for the `xid` label."""
    return f'xid=~"{"|".join(str(code) for code in codes)}"'
