"""MemoryTree answers as the same files on disk do, through set, replace and remove; and a Mirror writes one out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.exporter.tree import DiskTree, MemoryTree, Tree
from gpufleet.simulator.mirror import Mirror


def _answer(tree: Tree, path: str) -> bytes | int:
    try:
        return tree.read(path)
    except OSError as err:
        return err.errno or 0


class _Both:
    """One MemoryTree and one real directory, changed alike."""

    def __init__(self, root: Path) -> None:
        self.memory = MemoryTree()
        self.root = root
        self.disk = DiskTree(root)

    def set(self, path: str, text: str) -> None:
        self.memory.set(path, text)
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        if (self.root / path).is_dir():
            shutil.rmtree(self.root / path)
        (self.root / path).write_text(f"{text}\n")

    def remove(self, path: str) -> None:
        self.memory.remove(path)
        target = self.root / path
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


PATHS = ["class/net/eth0/speed", "class/net/eth0/statistics/rx_bytes", "class/net/eth0", "class/net/eth1/speed",
         "class/net", "bus/pci/devices/0000:17:00.0/vendor"]


def test_reads_match_the_disk_after_each_change(tmp_path):
    both = _Both(tmp_path)
    steps = [
        lambda: both.set("class/net/eth0/speed", "400000"),
        lambda: both.set("class/net/eth0/statistics/rx_bytes", "17"),
        lambda: both.set("class/net/eth1/speed", "100000"),
        lambda: both.set("class/net/eth0/speed", "200000"),  # Rewritten in place.
        lambda: both.remove("class/net/eth0"),  # A hot-unplugged device: everything below goes.
        lambda: both.set("class/net/eth0/statistics/rx_bytes", "18"),  # It comes back.
        lambda: both.set("class/net/eth0", "now a file"),  # A directory replaced by a file.
        lambda: both.set("bus/pci/devices/0000:17:00.0/vendor", "0x10de"),
        lambda: both.remove("class/net"),
    ]
    for number, step in enumerate(steps, 1):
        step()
        for path in PATHS:
            assert _answer(both.memory, path) == _answer(both.disk, path), f"after step {number}: {path}"


def test_a_counter_file_is_read_anew_each_time():
    tree = MemoryTree()
    ticks = iter(range(3))
    tree.set("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data", lambda: str(next(ticks)))
    reads = [tree.read("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data") for _ in range(3)]
    assert reads == [b"0\n", b"1\n", b"2\n"]


def test_a_link_is_not_a_file():
    tree = MemoryTree()
    tree.set("class/net/eth0/device", "a file first")
    tree.link("class/net/eth0/device", "../../../0000:17:00.0")
    with pytest.raises(FileNotFoundError):
        tree.read("class/net/eth0/device")
    assert tree.readlink("class/net/eth0/device") == "../../../0000:17:00.0"
    with pytest.raises(IsADirectoryError):
        tree.read("class/net/eth0")


def test_a_mirror_writes_the_tree_out_and_follows_its_changes(tmp_path):
    """The simulator's copy for node_exporter: files as they read now, links as symlinks whose targets resolve,
    and what the tree drops dropped on disk too."""
    count = [7]
    tree = MemoryTree()
    tree.set("class/net/eth0/statistics/rx_bytes", lambda: str(count[0]))
    tree.set("class/hwmon/hwmon0/name", "coretemp")
    tree.link("class/hwmon/hwmon0/device", "../../../coretemp.0")
    tree.set("bus/pci/devices/0000:18:00.0/vendor", "0x10de")
    mirror = Mirror(tree, tmp_path)
    mirror.sync()
    assert (tmp_path / "class/net/eth0/statistics/rx_bytes").read_text() == "7\n"
    assert (tmp_path / "class/hwmon/hwmon0/device").resolve() == (tmp_path / "coretemp.0").resolve()
    assert (tmp_path / "class/hwmon/hwmon0/device").is_symlink()
    assert DiskTree(tmp_path).read("class/hwmon/hwmon0/name") == tree.read("class/hwmon/hwmon0/name")
    count[0] = 8
    tree.remove("bus/pci/devices/0000:18:00.0")
    mirror.sync()
    assert (tmp_path / "class/net/eth0/statistics/rx_bytes").read_text() == "8\n"
    assert not (tmp_path / "bus/pci/devices/0000:18:00.0/vendor").exists()
    # Between walks only the live files are read again; a fixed file replaced is a change of the tree.
    count[0] = 9
    mirror.sync()
    assert (tmp_path / "class/net/eth0/statistics/rx_bytes").read_text() == "9\n"
    tree.set("class/hwmon/hwmon0/name", "k10temp")
    mirror.sync()
    assert (tmp_path / "class/hwmon/hwmon0/name").read_text() == "k10temp\n"
    assert not list(tmp_path.rglob(".*.partial"))
