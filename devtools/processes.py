"""Servers started for a test or a benchmark: run, wait until they answer, stop however the run ends."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Literal

from gpufleet.devtools.net import http, listening
from gpufleet.devtools.waiting import HarnessError, wait_for

# Where a program's output goes: a temporary file shown when it fails to start, nowhere, or this terminal.
Output = Literal["file", "discard", "inherit"]


@dataclass
class Server:
    """A running program and the URL it answers on; `log` holds its output (None where it goes elsewhere)."""

    process: subprocess.Popen[str]
    url: str
    log: IO[str] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self, limit: int = 4000) -> str:
        """The last `limit` characters the program wrote, where they were kept."""
        if self.log is None:
            return "(its output was not kept)"
        self.log.seek(0)
        return self.log.read()[-limit:]

    def stop(self, seconds: float = 15.0) -> None:
        stop(self.process, seconds)
        if self.log is not None:
            self.log.close()


def stop(process: subprocess.Popen[str], seconds: float = 15.0) -> None:
    """SIGTERM, so the program can flush what it holds; SIGKILL if it has not ended within `seconds`."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def start(argv: Sequence[str], port: int, ready_path: str, what: str, timeout: float, ready_status: int = 200,
          output: Output = "file", env: Mapping[str, str] | None = None) -> Server:
    """Run `argv` and return it once `ready_path` on `port` answers `ready_status`.

    Its output goes to a temporary file by default, shown when it fails to start, not to a pipe: a program that
    logs an error per failed write or rule evaluation (vmagent, vmalert while their store is down) fills a pipe
    nobody reads within minutes and then blocks. A benchmark that runs for an hour discards the chatter of the
    stores, and leaves its own programs' warnings on the terminal (`inherit`).
    """
    log = tempfile.TemporaryFile("w+") if output == "file" else None  # noqa: SIM115 (the Server closes it)
    sink: IO[str] | int | None = log if log is not None else (subprocess.DEVNULL if output == "discard" else None)
    try:
        process = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.STDOUT if sink is not None else None,
                                   text=True, env=None if env is None else dict(env))
    except OSError as err:
        if log is not None:
            log.close()
        raise HarnessError(f"{what}: cannot run {argv[0]}: {err}") from None
    server = Server(process, f"http://127.0.0.1:{port}", log)

    def answering() -> bool:
        if process.poll() is not None:
            raise HarnessError(f"{what}: process exited with {process.returncode}:\n{server.output()}")
        try:
            return listening(port) and http("GET", server.url + ready_path, timeout=1)[0] == ready_status
        except OSError:  # Accepted but not answering yet: a simulator still building a thousand nodes.
            return False

    try:
        wait_for(answering, timeout, what)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def serving(argv: Sequence[str], port: int, ready_path: str, what: str, timeout: float, ready_status: int = 200,
            output: Output = "file", env: Mapping[str, str] | None = None,
            stop_seconds: float = 15.0) -> Iterator[Server]:
    """`start`, as a context: the program is stopped however the block ends."""
    server = start(argv, port, ready_path, what, timeout, ready_status, output, env)
    try:
        yield server
    finally:
        server.stop(stop_seconds)
