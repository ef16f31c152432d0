"""The site's own check that a repaired node is fit for work (`dcgmi diag -r 1`, an NCCL test over ssh, ...),
run before gpufleet resumes a node: a command line in which `{node}` is the Slurm node's name, with a timeout."""

from __future__ import annotations

import asyncio
import os
import shlex


class Check:
    def __init__(self, command: str, timeout: float) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError("the check command is empty")
        self.timeout = timeout

    async def run(self, node: str) -> tuple[bool, str]:
        """Whether the check passed, and what it said (its last line of output, or why it did not run)."""
        argv = [word.replace("{node}", node) for word in self.argv]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "GPUFLEET_NODE": node}, start_new_session=True)
        except OSError as err:
            return False, f"check did not start: {err}"
        try:
            out, _ = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return False, f"check timed out after {self.timeout:g}s"
        lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
        said = lines[-1][:160] if lines else "no output"
        if process.returncode != 0:
            return False, f"check exited {process.returncode}: {said}"
        return True, said
