"""An in-memory sysfs tree: the simulated nodes' NICs and sensors, read through the exporter's SysfsReader.

Files hold either text or a function that returns it, evaluated at read time,
so counters follow the simulated clock without rewriting anything. Reads fail
with the errno the kernel would use (ENOENT, EISDIR), so the collectors' error
handling runs as it does on a real node.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

Content = str | Callable[[], str]


@dataclass(frozen=True)
class Link:
    target: str


class MemoryTree:
    def __init__(self) -> None:
        self._root: dict[str, object] = {}

    def set(self, path: str, content: Content) -> None:
        *parents, name = PurePosixPath(path).parts
        directory = self._root
        for part in parents:
            directory = directory.setdefault(part, {})  # type: ignore[assignment]
        directory[name] = content

    def link(self, path: str, target: str) -> None:
        self.set(path, Link(target))  # type: ignore[arg-type]

    def remove(self, path: str) -> None:
        """Drop a file or a whole directory, as a hot-unplug does."""
        *parents, name = PurePosixPath(path).parts
        directory = self._node(PurePosixPath(*parents)) if parents else self._root
        if isinstance(directory, dict):
            directory.pop(name, None)

    def _node(self, path: PurePosixPath) -> object:
        node: object = self._root
        for part in path.parts:
            if not isinstance(node, dict) or part not in node:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
            node = node[part]
        return node

    def read(self, path: PurePosixPath) -> bytes:
        node = self._node(path)
        if isinstance(node, dict):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if isinstance(node, Link):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        text = node() if callable(node) else node
        return f"{text}\n".encode()

    def listdir(self, path: PurePosixPath) -> list[str]:
        node = self._node(path)
        if not isinstance(node, dict):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        return list(node)

    def readlink(self, path: PurePosixPath) -> str:
        node = self._node(path)
        if not isinstance(node, Link):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        return node.target

    def is_dir(self, path: PurePosixPath) -> bool:
        try:
            return isinstance(self._node(path), dict)
        except OSError:
            return False
