"""NVSwitch errors (SXids) as the `nvidia-nvswitch` driver writes them to the kernel log, and what they mean to a
node, from NVIDIA's Fabric Manager user guide ("NVSwitch SXid Errors").

Each error is one primary line, `nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS
crumbstore MCTO (First)`, which lines of the same code follow (`Severity 0 Engine instance ...`, `Data {...}`):
only the primary line is counted, or one error would count three times. Whether an error is fatal is the
driver's word on that line, decided when it happens (whether the port had to be locked), so it is read from
there rather than from a table of codes; the guide's table says only which codes are always fatal to the whole
fabric, beyond the one link, which the runbook lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PRIMARY = re.compile(r"nvidia-nvswitch\d+: SXid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\): "
                      r"(\d+), (Fatal|Non-fatal|Correctable),")
# The driver's word -> the `class` label.
CLASSES = {"Fatal": "fatal", "Non-fatal": "non_fatal", "Correctable": "correctable"}


@dataclass(frozen=True)
class Sxid:
    switch: str  # The NVSwitch's PCI address, with its function, as the driver prints it.
    code: int
    error_class: str  # One of CLASSES' values.


def parse_sxid(message: str) -> Sxid | None:
    """The SXid a kernel message reports, if it is an SXid's primary line."""
    match = _PRIMARY.search(message)
    if match is None:
        return None
    return Sxid(match.group(1).lower(), int(match.group(2)), CLASSES[match.group(3)])
