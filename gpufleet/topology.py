"""Where each node sits (rack, leaf switch), as labels the scrape configuration puts on its series: the one
file format the scrape targets, the simulator and a site share.

With a `leaf` label on every node, a leaf switch that drops the links of all the nodes behind it is one
incident naming the leaf (`FabricLeafDown`) rather than one per node; without a topology everything works
per node. A site writes one YAML file:

    nodes:
      gpu-node-0001: {rack: r01, leaf: su1}
      gpu-node-0002: {rack: r01, leaf: su1}

In a rail-optimised fabric a node's HCAs go to as many leaf switches, one per rail; `leaf` then names the
group of leaves that a set of nodes shares (the scalable unit), and the alert names the rail by its HCA
(`device`). `gpufleet alerts topology` turns the file into file_sd targets, or into relabelling rules for
a site that keeps its own service discovery (kube-prometheus-stack's ServiceMonitor relabelings among them).
It also writes the file's first draft from what the fabric says of itself (`ibnetdiscover`), since a
hand-kept map of thousands of cables is wrong by the second week; racks are the site's to add.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LABEL_VALUE = re.compile(r"^[\w.-]+$")  # What a switch name must be to name a leaf; others go by their GUID.
# Labels the scrape itself sets, which a topology must not replace.
RESERVED = frozenset({"instance", "job", "cluster"})


# ibnetdiscover's lines for a switch, and for one of its ports cabled to an HCA (`H-` GUID), each followed by
# the node description in quotes after `#`. An HCA's description is "HOST DEVICE" as rdma-ndd sets it.
_SWITCH_LINE = re.compile(r'^Switch\s+\d+\s+"(S-[0-9a-fA-F]+)"\s*#\s*"([^"]*)"')
# A chassis's ports (`ibnetdiscover -g`) carry their external number after the port: `[12][ext 6]`.
_HCA_PORT_LINE = re.compile(
    r'^\[\d+\](?:\[ext \d+\])?\s+"H-[0-9a-fA-F]+"\[\d+\](?:\([0-9a-fA-F]+\))?\s*#\s*"([^"]*)"')
# A Quantum switch's description as its firmware writes it: MF0;<name>:<model>/U1.
_SWITCH_NAME = re.compile(r"^MF0;([^:]+):")


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names the file and the node."""


@dataclass(frozen=True)
class Topology:
    """Each node's place, as label name -> value."""

    nodes: dict[str, dict[str, str]]

    def groups(self) -> list[tuple[dict[str, str], list[str]]]:
        """The nodes grouped by identical labels, in order of first appearance: one file_sd entry each."""
        grouped: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for node, labels in self.nodes.items():
            grouped.setdefault(tuple(sorted(labels.items())), []).append(node)
        return [(dict(labels), nodes) for labels, nodes in grouped.items()]


def load(path: str | Path) -> Topology:
    """The topology of a YAML file, each node's labels checked."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise TopologyError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise TopologyError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(document, dict) or set(document) != {"nodes"} or not isinstance(document["nodes"], dict):
        raise TopologyError(f"{path}: expected a mapping with one key, 'nodes', of node name -> labels")
    nodes: dict[str, dict[str, str]] = {}
    for node, labels in document["nodes"].items():
        if not isinstance(labels, dict) or not labels:
            raise TopologyError(f"{path}: {node}: expected labels such as {{rack: r01, leaf: su1}}, not {labels!r}")
        for name, value in labels.items():
            if not isinstance(name, str) or not _LABEL.match(name) or name.startswith("__") or name in RESERVED:
                raise TopologyError(f"{path}: {node}: {name!r} is not a label a topology may set "
                                    f"(not {', '.join(sorted(RESERVED))}, nor one starting __)")
            if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
                raise TopologyError(f"{path}: {node}: {name} must be a name, not {value!r}")
        nodes[str(node)] = {name: str(value) for name, value in labels.items()}
    return Topology(nodes)


def file_sd(topology: Topology, port: int, extra: dict[str, str]) -> str:
    """Prometheus file_sd targets: each node at `port`, with its place and the `extra` labels (a cluster)."""
    entries = [{"targets": [f"{node}:{port}" for node in nodes], "labels": {**extra, **labels}}
               for labels, nodes in topology.groups()]
    return json.dumps(entries, indent=2) + "\n"


def relabel_configs(topology: Topology, source: str) -> str:
    """`relabel_configs` that set each node's labels from `source` (a node name, or `name:port`), for a scrape
    job with service discovery of its own."""
    rules: list[dict[str, Any]] = []
    for labels, nodes in topology.groups():
        regex = "(" + "|".join(re.escape(node) for node in nodes) + ")(:[0-9]+)?"
        rules += [{"source_labels": [source], "regex": regex, "target_label": name, "replacement": value}
                  for name, value in sorted(labels.items())]
    return yaml.safe_dump(rules, sort_keys=False, width=1000)


@dataclass(frozen=True)
class Discovered:
    """A topology drawn from the fabric, and the HCA ports left out of it, for the operator to see."""

    topology: Topology
    skipped: list[str]


def from_ibnetdiscover(text: str, source: str, exclude: re.Pattern[str] | None = None) -> Discovered:
    """Each host's leaf from `ibnetdiscover` output: the switch its HCAs are cabled to. In a rail-optimised
    fabric a host reaches one leaf per rail; leaves that share hosts form a scalable unit, named after its
    first leaf by name, so that a host whose first rail is down still sits with its unit. HCAs whose device
    matches `exclude` in full (a storage HCA on leaves of its own) are left out, as are ports whose HCA
    description is not "HOST DEVICE" and switch-port lines naming an HCA that do not parse."""
    switches: dict[str, str] = {}  # GUID -> name
    cabled: dict[str, set[str]] = {}  # host -> GUIDs of the switches its HCAs reach
    skipped: list[str] = []
    switch = None
    for raw in text.splitlines():
        line = raw.strip()
        if (found := _SWITCH_LINE.match(line)) is not None:
            guid, description = found.groups()
            named = _SWITCH_NAME.match(description)
            switches[guid] = named.group(1) if named else description or guid
            switch = guid
        elif not line or line.startswith(("Ca", "Rt")):
            switch = None  # A blank line or another node's header ends a switch's ports.
        elif switch is not None and line.startswith("[") and '"H-' in line:
            port = _HCA_PORT_LINE.match(line)
            words = port.group(1).split() if port else []
            if port is None:
                skipped.append(f"{line!r} on {switches[switch]}: not a switch port as ibnetdiscover writes one")
            elif len(words) != 2:
                skipped.append(f"{port.group(1)!r} on {switches[switch]}: not HOST DEVICE")
            elif exclude is None or not exclude.fullmatch(words[1]):
                cabled.setdefault(words[0], set()).add(switch)
    if not cabled:
        raise TopologyError(f"{source}: no switch port leads to an HCA named HOST DEVICE; expected the output of "
                            f"ibnetdiscover, with rdma-ndd's node descriptions")
    units = _units(cabled.values(), _unique_names(switches))
    nodes = {host: {"leaf": units[next(iter(guids))]} for host, guids in sorted(cabled.items())}
    return Discovered(Topology(nodes), skipped)


def _units(reached: Collection[set[str]], names: dict[str, str]) -> dict[str, str]:
    """Each leaf's scalable unit, by name: the leaves joined by the hosts that reach more than one of them."""
    parent = {guid: guid for guids in reached for guid in guids}

    def root(guid: str) -> str:
        while parent[guid] != guid:
            parent[guid] = parent[parent[guid]]
            guid = parent[guid]
        return guid

    for guids in reached:
        first, *others = sorted(guids)
        for other in others:
            parent[root(other)] = root(first)
    members: dict[str, list[str]] = {}
    for guid in parent:
        members.setdefault(root(guid), []).append(guid)
    return {guid: min(names[leaf] for leaf in members[root(guid)]) for guid in parent}


def _unique_names(switches: dict[str, str]) -> dict[str, str]:
    """Each switch's name, or its GUID where the name is shared (switches left at the factory description)."""
    counts: dict[str, int] = {}
    for name in switches.values():
        counts[name] = counts.get(name, 0) + 1
    return {guid: name if counts[name] == 1 and _LABEL_VALUE.match(name) else guid
            for guid, name in switches.items()}


def to_yaml(topology: Topology) -> str:
    """The topology as the file `load` reads."""
    return yaml.safe_dump({"nodes": topology.nodes}, sort_keys=False, width=1000)
