"""NVIDIA's XID catalog, reduced to what an operator must do about each code; one table, used by every rule."""

from __future__ import annotations

# Codes after which the GPU must be reset or the node rebooted (page).
RESET_OR_REBOOT = (48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, *range(144, 151), 155, 156, 158)
# Recorded by the driver, worth a ticket: row remap event, high single-bit rate, contained memory error.
WATCH = (63, 92, 94)
# The application's own fault (illegal address, MMU fault, ...): information, a ticket when repeated.
APPLICATION = (13, 31, 43, 45)


def matcher(codes: tuple[int, ...]) -> str:
    """A PromQL regex matcher for the `xid` label."""
    return f'xid=~"{"|".join(str(code) for code in codes)}"'
