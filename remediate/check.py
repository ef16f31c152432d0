"""The site's own check that a repaired node is fit for work (`dcgmi diag -r 1`, an NCCL test over ssh, ...),
run before gpufleet resumes a node: a command line in which `{node}` is the Slurm node's name, with a timeout."""

from __future__ import annotations

import os
import shlex

from gpufleet.remediate import command


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
            status, out, _ = await command.run(argv, self.timeout, {**os.environ, "GPUFLEET_NODE": node}, merged=True)
        except TimeoutError:  # First: TimeoutError is an OSError.
            return False, f"check timed out after {self.timeout:g}s"
        except OSError as err:
            return False, f"check did not start: {err}"
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        said = lines[-1][:160] if lines else "no output"
        if status != 0:
            return False, f"check exited {status}: {said}"
        return True, said
