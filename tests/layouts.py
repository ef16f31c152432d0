"""Job layouts the end-to-end tests give the simulator, so that what they expect never rests on a seed."""

from __future__ import annotations

from pathlib import Path

import yaml


def node(number: int) -> str:
    return f"gpu-node-{number:04d}"


def nodes(*numbers: int) -> list[str]:
    return [node(n) for n in numbers]


# Sixteen nodes: a large Slurm job, a Kubernetes job of four pods, a Slurm job of two (too small to have
# a straggler), and nodes 5 and 7 idle. The tests run the rules at a time scale of 8, so the jobs' steps
# are an eighth of production ones (45, 33 and 20 s): a signal window must hold several steps, as 2
# minutes do in production, or its average depends on where in a step it begins.
SIXTEEN_NODES = {"jobs": [
    {"id": "944279", "scheduler": "slurm", "nodes": nodes(1, 2, 3, 6, 8, 11, 13, 14),
     "period": 5.6, "comm_fraction": 0.28, "memory_fraction": 0.67},
    {"id": "e3666734-1319-4d33-8192-05760e733588", "scheduler": "kubernetes", "nodes": nodes(4, 9, 12, 16),
     "period": 4.1, "comm_fraction": 0.31, "memory_fraction": 0.65},
    {"id": "432958", "scheduler": "slurm", "nodes": nodes(10, 15),
     "period": 2.5, "comm_fraction": 0.28, "memory_fraction": 0.87},
]}


# Where the sixteen nodes sit: four racks of four, every node's InfiniBand rails on one group of leaf switches.
SIXTEEN_NODES_TOPOLOGY = {"nodes": {node(n): {"rack": f"r{(n - 1) // 4 + 1}", "leaf": "su1"} for n in range(1, 17)}}


def write(path: Path, layout: dict) -> Path:
    path.write_text(yaml.safe_dump(layout))
    return path
