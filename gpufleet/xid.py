"""NVIDIA's XID catalogue, reduced to what an operator must do about each code, and the recovery actions a GPU
can need: the one table the exporter, the rules, the dashboards and the simulator all read.

The classes follow NVIDIA's XID catalogue as gpud and NVSentinel apply it. The actions mirror what the
driver itself reports where it can (NVML's recovery-action field), ordered so that the larger one covers the
smaller: a GPU that needs its node rebooted needs no separate reset.
"""

from __future__ import annotations

from enum import IntEnum

# Codes that name a specific hardware failure, raised by the simulator's faults of the same kind.
DOUBLE_BIT_ECC = 48
ROW_REMAP_FAILURE = 64
FALLEN_OFF_BUS = 79
GSP_TIMEOUT = 119  # An RPC to the GPU System Processor timed out: the driver, and nvidia-smi, stop answering.
CONTAINED_ECC = 94  # An uncorrectable memory error the GPU contained: only the job that touched it was killed.
UNCONTAINED_ECC = 95  # One it could not contain: every job on the GPU is suspect, and it needs a reset now.

# Codes after which the GPU must be reset or the node rebooted (page).
RESET_OR_REBOOT = (DOUBLE_BIT_ECC, 62, ROW_REMAP_FAILURE, 74, FALLEN_OFF_BUS, UNCONTAINED_ECC, 109, GSP_TIMEOUT,
                   120, 136, 140, 143, *range(144, 151), 155, 156, 158)
# Recorded by the driver, worth a ticket: row remap event, high single-bit rate, contained memory error.
WATCH = (63, 92, CONTAINED_ECC)
# The application's own fault (illegal address, MMU fault, ...): information, a ticket when repeated.
APPLICATION = (13, 31, 43, 45)
CLASSES = {"reset or reboot": RESET_OR_REBOOT, "watch": WATCH, "application": APPLICATION}
CLASSED = tuple(sorted(code for codes in CLASSES.values() for code in codes))  # Every code of a class.


class Action(IntEnum):
    """What a GPU needs before it can run work again, the value of `gpufleet_gpu_recovery_action`."""

    NONE = 0
    DRAIN = 1  # Take work off it (the driver's DRAIN_P2P: peer-to-peer is unsafe until the fabric recovers).
    RESET = 2  # A GPU reset (nvidia-smi -r), with the node drained first.
    REBOOT = 3  # A reboot of the node: the GPU fell off the bus, or the driver asks for one.
    REPLACE = 4  # A new board: it can no longer repair its memory.


def action_for(xid: int) -> Action:
    """The action an XID calls for on its own; codes outside the reset-or-reboot class call for none."""
    if xid == FALLEN_OFF_BUS:
        return Action.REBOOT
    if xid == ROW_REMAP_FAILURE:
        return Action.REPLACE
    return Action.RESET if xid in RESET_OR_REBOOT else Action.NONE
