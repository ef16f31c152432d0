"""A simulated node's sysfs and procfs written out as real files, for programs that read a root path: Debian's
node_exporter, run beside gpufleet with `--path.sysfs` and `--path.procfs` on the node's copy.

The copy is brought up to date at each of the node's collections, so node_exporter reads what gpufleet's own
collectors read at the same simulated instant. Each file is replaced whole (written beside, then renamed), so a
reader never sees half a counter; only files whose text changed are written, and files gone from the tree
(a board unplugged, a process ended) are removed. The whole tree is walked only when its shape or a fixed file
changed (`MemoryTree.version`); otherwise only its live files (counters that follow the clock) are read: a walk
at every collection kept a fleet beside its node_exporters from answering its scrapes in time.
A link becomes a symlink, and its target a directory where nothing is there, because node_exporter names a
hwmon chip after the device its `device` link resolves to.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from gpufleet.exporter.tree import MemoryTree, Tree


def walk(tree: Tree, path: str = "") -> Iterator[tuple[str, bool]]:
    """Every file and link below `path`: (path, whether it is a link)."""
    for name in tree.listdir(path):
        child = f"{path}/{name}" if path else name
        try:
            tree.readlink(child)  # First: a link to a directory is a link, not a directory to copy.
        except OSError:
            if tree.is_dir(child):
                yield from walk(tree, child)
            else:
                yield child, False
        else:
            yield child, True


class Mirror:
    """One tree's copy under `root`, kept up to date by `sync`."""

    def __init__(self, tree: Tree, root: Path) -> None:
        self.tree = tree
        self.root = root
        self._written: dict[str, bytes | str] = {}  # Path -> the text written there, or a link's target.
        self._version: int | None = None  # The tree's version at the last walk.
        self._live: list[str] = []  # The live files the last walk found.

    def sync(self) -> None:
        tree = self.tree
        version = tree.version if isinstance(tree, MemoryTree) else None  # A real tree is walked every time.
        if version is not None and version == self._version:
            for path in self._live:
                self._copy(path, False)
            return
        self._version = version
        seen = set()
        for path, is_link in walk(tree):
            seen.add(path)
            self._copy(path, is_link)
        if isinstance(tree, MemoryTree):
            self._live = [path for path in seen if tree.is_live(path)]
        for path in [path for path in self._written if path not in seen]:
            (self.root / path).unlink(missing_ok=True)
            del self._written[path]

    def _copy(self, path: str, is_link: bool) -> None:
        try:
            content: bytes | str = self.tree.readlink(path) if is_link else self.tree.read(path)
        except OSError:  # A file the simulated kernel refuses to read is left out, as it reads nowhere.
            return
        if self._written.get(path) != content:
            self._write(path, content)
            self._written[path] = content

    def _write(self, path: str, content: bytes | str) -> None:
        target = self.root / path
        if isinstance(content, str):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            target.symlink_to(content)
            (target.parent / content).mkdir(parents=True, exist_ok=True)
            return
        # A counter is rewritten at every collection: plain system calls on strings, and its directory made only
        # the first time, keep the mirror's cost near the files' own.
        if path not in self._written:
            target.parent.mkdir(parents=True, exist_ok=True)
        folder, _, name = f"{self.root}/{path}".rpartition("/")
        partial = f"{folder}/.{name}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, content)
        finally:
            os.close(fd)
        os.replace(partial, f"{folder}/{name}")
