"""Reading sysfs and procfs trees under a configurable root, the way node_exporter's `--path.sysfs` does.

sysfs files come and go while we read them (a NIC is hot-unplugged, a driver is
reloaded) and some files answer with an error by design (`speed` of a link that
is down returns EINVAL). A reader therefore distinguishes two outcomes:

* absent: the file does not exist or the kernel says the value is not available;
  the series is left out and nothing is reported, because that is the normal
  state of the hardware;
* broken: the file exists but cannot be read or parsed; the series is left out
  and the problem is recorded, so that the collector reports a failed collection.

Paths are relative to the tree's root throughout, so problems never name host
paths. The tree itself (`exporter.tree`) is the hardware boundary.
"""

from __future__ import annotations

import errno

from gpufleet.exporter.tree import Tree

# Errors with which sysfs attributes say "no value right now" rather than "broken".
_ABSENT_ERRNOS = frozenset({
    errno.ENOENT, errno.ENOTDIR, errno.EINVAL, errno.ENODEV, errno.ENXIO, errno.EOPNOTSUPP, errno.ENODATA, errno.EAGAIN,
})


class SysfsReader:
    """Reads files of one tree and records what could not be read, for one collection."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.problems: list[str] = []

    def listdir(self, relative: str) -> list[str]:
        """Sorted entries of a directory; an absent directory is an empty one."""
        try:
            return sorted(self.tree.listdir(relative))
        except OSError as err:
            if err.errno not in _ABSENT_ERRNOS:
                self.problems.append(f"{relative}: cannot list: {err.strerror}")
            return []

    def readlink(self, relative: str) -> str | None:
        try:
            return self.tree.readlink(relative)
        except OSError:
            return None

    def is_dir(self, relative: str) -> bool:
        return self.tree.is_dir(relative)

    def text(self, path: str) -> str | None:
        """The stripped content of a file, or None when absent or unreadable."""
        try:
            raw = self.tree.read(path)
        except OSError as err:
            if err.errno not in _ABSENT_ERRNOS:
                self.problems.append(f"{path}: cannot read: {err.strerror}")
            return None
        try:
            return raw.decode("ascii").strip()
        except UnicodeDecodeError:
            self.problems.append(f"{path}: not ASCII text")
            return None

    def integer(self, path: str) -> int | None:
        """A file holding one integer (decimal or 0x-prefixed hexadecimal)."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return int(text, 0) if text.startswith(("0x", "0X")) else int(text)
        except ValueError:
            self.problems.append(f"{path}: not an integer: {text[:40]!r}")
            return None

    def counter(self, path: str) -> int | None:
        """A monotonically increasing hardware counter: an integer that is never negative."""
        value = self.integer(path)
        if value is not None and value < 0:
            self.problems.append(f"{path}: negative counter {value}")
            return None
        return value
