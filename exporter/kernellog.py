"""The kernel log, read the way a collector reads hardware: the messages added since its last read, with no
thread of its own.

`/dev/kmsg` hands out one record per read, `<priority>,<sequence>,<time>,<flags>;<message>`, and answers
EAGAIN once none is left; a reader that falls behind the kernel's ring buffer gets EPIPE once and carries on
from the oldest record kept. A reader starts at the end of the log, so a restarted exporter does not count its
node's old messages again. The same code follows a plain file that grows, as tests and `--path.kmsg` give it.
The simulator gives each node a log of its own (`Hardware.kernel_log`).
"""

from __future__ import annotations

import errno
import os
import re
from typing import Protocol

_HEADER = re.compile(r"^(\d+),\d+,\d+,[^;]*;")
MAX_READS = 10_000  # Records or chunks read per collection: a flood of messages is read over several.


class KernelLogReader(Protocol):
    def read(self) -> list[str]:
        """The messages added since the last read (none at the first); raises OSError while the log cannot be
        read."""

    def close(self) -> None: ...


class KernelLog(Protocol):
    def reader(self) -> KernelLogReader:
        """A reader positioned at the end of the log."""


class DevKmsg:
    """The node's own kernel log, `/dev/kmsg` by default: reading it takes CAP_SYSLOG where
    `kernel.dmesg_restrict` is 1."""

    def __init__(self, path: str) -> None:
        self.path = path

    def reader(self) -> KmsgReader:
        return KmsgReader(self.path)


class KmsgReader:
    """Opens the log at its first read, and again at the next read after an error."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._partial = b""

    def read(self) -> list[str]:
        if self._fd is None:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                os.close(fd)
                raise
            self._fd, self._partial = fd, b""
            return []
        chunks = []
        try:
            for _ in range(MAX_READS):
                try:
                    chunk = os.read(self._fd, 8192)
                except BlockingIOError:
                    break
                except OSError as err:
                    if err.errno == errno.EPIPE:  # The ring buffer overwrote records not yet read: carry on.
                        continue
                    raise
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:
            self.close()
            raise
        lines = (self._partial + b"".join(chunks)).split(b"\n")
        self._partial = lines.pop()
        messages = (_message(line.decode("utf-8", errors="replace")) for line in lines if line[:1].strip())
        return [message for message in messages if message is not None]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _message(line: str) -> str | None:
    """A record's message, without /dev/kmsg's header where it has one; None for a record a process wrote to
    /dev/kmsg (a facility other than the kernel's, 0), which could pose as the kernel."""
    header = _HEADER.match(line)
    if header is None:
        return line
    return line[header.end():] if int(header.group(1)) >> 3 == 0 else None
