"""The commands the remediator runs (`scontrol`, the site's check), each in a session of its own with a timeout,
past which the whole session is killed: nothing it started (an ssh, a diagnostic) is left running."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence


async def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
              merged: bool = False) -> tuple[int, str, str]:
    """The exit status, output and error output (with `merged`, both in the output). Raises OSError where the
    command cannot start, and TimeoutError past `timeout`."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT if merged else asyncio.subprocess.PIPE,
        env=env, start_new_session=True)
    try:
        out, error = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        raise
    return process.returncode or 0, out.decode(errors="replace"), (error or b"").decode(errors="replace")
