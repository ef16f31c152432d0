"""Facts about the NVML library surface that the session and the XID watcher share.

NVML errors fall into classes that each need a different answer (see
`exporter.gpu.session`); keeping the classes here means both users of NVML
agree on what "the driver is gone" means.
"""

from __future__ import annotations

from typing import Any

import pynvml

UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
TRANSIENT = frozenset({pynvml.NVML_ERROR_NO_DATA, pynvml.NVML_ERROR_NOT_READY})
DEVICE_LOST = frozenset(
    {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_GPU_NOT_FOUND, pynvml.NVML_ERROR_RESET_REQUIRED}
)
DRIVER_LOST = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_UNKNOWN,
    }
)


def as_text(value: Any) -> str:
    """NVML strings arrive as str from recent nvidia-ml-py and as bytes from older releases."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Backoff:
    """Exponential backoff for re-initialising NVML: a node mid-driver-reload is not hammered."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.delay = initial, maximum, initial

    def next(self) -> float:
        """The delay before the next attempt; each call doubles the one after, up to the maximum."""
        delay, self.delay = self.delay, min(self.delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial
