"""Reading sysfs trees under a configurable root, the way node_exporter's `--path.sysfs` does.

sysfs files come and go while we read them (a NIC is hot-unplugged, a driver is
reloaded) and some files answer with an error by design (`speed` of a link that
is down returns EINVAL). A reader therefore distinguishes two outcomes:

* absent: the file does not exist or the kernel says the value is not available;
  the series is left out and nothing is reported, because that is the normal
  state of the hardware;
* broken: the file exists but cannot be read or parsed; the series is left out
  and the problem is recorded, so that the collector reports a failed collection.

Problems name paths relative to the root, so logs never carry host paths.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Errors with which sysfs attributes say "no value right now" rather than "broken".
_ABSENT_ERRNOS = frozenset(
    {errno.ENOENT, errno.ENOTDIR, errno.EINVAL, errno.ENODEV, errno.ENXIO, errno.EOPNOTSUPP, errno.ENODATA, errno.EAGAIN}
)


class SysfsReader:
    """Reads files below `root` and records what could not be read, for one collection."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.problems: list[str] = []

    def path(self, relative: str) -> Path:
        return self.root / relative

    def relative(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return path.name

    def listdir(self, relative: str) -> list[str]:
        """Sorted entries of a directory; an absent directory is an empty one."""
        try:
            return sorted(os.listdir(self.path(relative)))
        except OSError as err:
            if err.errno not in _ABSENT_ERRNOS:
                self.problems.append(f"{relative}: cannot list: {err.strerror}")
            return []

    def text(self, path: Path) -> str | None:
        """The stripped content of a file, or None when absent or unreadable."""
        try:
            with open(path, "rb") as handle:
                raw = handle.read(4096)
        except OSError as err:
            if err.errno not in _ABSENT_ERRNOS:
                self.problems.append(f"{self.relative(path)}: cannot read: {err.strerror}")
            return None
        try:
            return raw.decode("ascii").strip()
        except UnicodeDecodeError:
            self.problems.append(f"{self.relative(path)}: not ASCII text")
            return None

    def integer(self, path: Path) -> int | None:
        """A file holding one integer (decimal or 0x-prefixed hexadecimal)."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return int(text, 0) if text.startswith(("0x", "0X")) else int(text)
        except ValueError:
            self.problems.append(f"{self.relative(path)}: not an integer: {text[:40]!r}")
            return None

    def counter(self, path: Path) -> int | None:
        """A monotonically increasing hardware counter: an integer that is never negative."""
        value = self.integer(path)
        if value is not None and value < 0:
            self.problems.append(f"{self.relative(path)}: negative counter {value}")
            return None
        return value
