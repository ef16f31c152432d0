"""The file trees collectors read: the hardware boundary for sysfs and procfs.

Collectors receive a `Tree`, never a path, so what they read is decided once,
by whoever builds the node: `DiskTree` is a real mount point (`--path.sysfs`,
`--path.procfs`, as node_exporter takes them), and `MemoryTree` is the
simulator's and the tests' stand-in. Both fail the way the kernel does
(OSError with ENOENT, EISDIR, ENOTDIR, EINVAL), so a collector's error handling
runs the same over either.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias

_MAX_READ = 4096  # sysfs attributes are at most a page.


class Tree(Protocol):
    """A file tree addressed by root-relative paths ("class/net/eth0/speed": plain strings, which cost a
    collector far less than `PurePosixPath`s); failures raise OSError with the kernel's errno."""

    def read(self, path: str) -> bytes: ...

    def listdir(self, path: str) -> list[str]: ...

    def readlink(self, path: str) -> str: ...

    def is_dir(self, path: str) -> bool: ...


class DiskTree:
    """The real files below a root directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)

    def read(self, path: str) -> bytes:
        # One read(2) on a bare descriptor: a sysfs attribute comes whole from the first read, and a node reads
        # some 400 files a collection, where `open()`'s buffered file object adds half again to the system
        # calls' time. A directory fails at the read with EISDIR, as it fails at `open()`.
        fd = os.open(f"{self.root}/{path}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, _MAX_READ)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(f"{self.root}/{path}")

    def readlink(self, path: str) -> str:
        return os.readlink(f"{self.root}/{path}")

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(f"{self.root}/{path}")


Content: TypeAlias = str | Callable[[], str]


@dataclass(frozen=True)
class _Link:
    target: str


_Node: TypeAlias = "dict[str, _Node] | Content | _Link"


def _missing(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


class MemoryTree:
    """Files held in memory: text, or a function that returns it when the file is read.

    A function lets a counter follow a simulated clock without rewriting anything.
    """

    def __init__(self) -> None:
        self._root: dict[str, _Node] = {}
        # Every file by its whole path as well: a simulated node reads some 400 files a collection, and one
        # lookup costs a fifth of a walk down the directories. Directories are found by the walk alone.
        self._files: dict[str, Content] = {}
        # Counts the changes a reader cannot see by reading the live files again: a file, link or directory
        # added, replaced or removed. A copy of the tree (the simulator's mirror for node_exporter) walks the
        # whole tree only when it moved.
        self.version = 0

    def set(self, path: str, content: Content) -> None:
        self._replace(path, content)
        self._files[path] = content

    def is_live(self, path: str) -> bool:
        """Whether the file's text is a function's, which may differ at every read."""
        return callable(self._files.get(path))

    def link(self, path: str, target: str) -> None:
        self._replace(path, _Link(target))

    def _replace(self, path: str, node: _Node) -> None:
        *parents, name = path.split("/")
        directory = self._directory(parents, create=True)
        if isinstance(directory.get(name), dict):
            self._forget(path)
        self._files.pop(path, None)
        directory[name] = node
        self.version += 1

    def remove(self, path: str) -> None:
        """Drop a file or a whole directory, as a hot-unplug does; nothing happens where there is nothing."""
        *parents, name = path.split("/")
        try:
            self._directory(parents, create=False).pop(name, None)
        except OSError:
            pass
        self._forget(path)
        self.version += 1

    def _forget(self, path: str) -> None:
        """Drop the file at `path`, or every file below it where it was a directory, from the index."""
        below = f"{path}/"
        for file in [file for file in self._files if file == path or file.startswith(below)]:
            del self._files[file]

    def _directory(self, parts: list[str], create: bool) -> dict[str, _Node]:
        directory = self._root
        for part in parts:
            child = directory.setdefault(part, {}) if create else directory.get(part)
            if not isinstance(child, dict):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/".join(parts))
            directory = child
        return directory

    def _node(self, path: str) -> _Node:
        node: _Node = self._root
        for part in path.split("/") if path else ():  # "" is the root, as DiskTree reads it.
            if isinstance(node, _Link):  # Links lead outside the tree, as sysfs's lead to devices.
                raise _missing(path)
            if not isinstance(node, dict):  # A file on the way down, as the kernel answers.
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if part not in node:
                raise _missing(path)
            node = node[part]
        return node

    def read(self, path: str) -> bytes:
        content = self._files.get(path)
        if content is None:  # Not a file: absent, a directory, or a link (which leads outside the tree).
            if isinstance(self._node(path), dict):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            raise _missing(path)
        return f"{content if isinstance(content, str) else content()}\n".encode()

    def listdir(self, path: str) -> list[str]:
        node = self._node(path)
        if not isinstance(node, dict):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return list(node)

    def readlink(self, path: str) -> str:
        node = self._node(path)
        if not isinstance(node, _Link):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return node.target

    def is_dir(self, path: str) -> bool:
        try:
            return isinstance(self._node(path), dict)
        except OSError:
            return False
