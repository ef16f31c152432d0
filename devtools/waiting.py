"""Bounded waits, and the one error the harness raises when something it needs is missing or late."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class HarnessError(SystemExit):
    """A program the check needs is missing, did not start, or a condition was not met in time.

    A SystemExit: a benchmark ends with the message alone, and a test that meets one fails with it.
    """


def wait_for(check: Callable[[], T | None], timeout: float, what: str,
             process: subprocess.Popen[str] | None = None, interval: float = 0.25) -> T:
    """Call `check()` every `interval` seconds until it returns something truthy, at most `timeout` seconds;
    returns that value. Fails at once, with the process's output where it has one, if `process` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        if process is not None and process.poll() is not None:
            output = process.communicate()[0] if process.stdout is not None else ""
            raise HarnessError(f"{what}: process exited with {process.returncode}:\n{output}")
        time.sleep(interval)
    raise HarnessError(f"{what}: not within {timeout:g}s")
