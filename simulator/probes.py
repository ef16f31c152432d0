"""Each node's probe port: a TCP port that answers while the node is up and is closed while it is not.

In production blackbox_exporter pings each node (ICMP): a node that answers but whose exporter does not is an
exporter down, one that does not answer is a node down. On loopback every address answers ping, so the simulator
gives each node a port of its own instead, open unless the node is rebooting or down (`NodeState.down_at`), for
blackbox_exporter's `tcp_connect` module to probe. The file_sd targets it writes name each node's `instance` as the
exporters' targets do, with the module to use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gpufleet.simulator.fleet import Fleet

log = logging.getLogger(__name__)
# How often, in wall-clock seconds, the ports follow the nodes' state: well inside a probe interval.
CHECK_SECONDS = 0.25
MODULE = "tcp_connect"  # blackbox_exporter's module, as its example configuration and gpufleet's name it.


def probe_targets(fleet: Fleet, host: str, first_port: int, labels: dict[str, str]) -> list[dict[str, object]]:
    """file_sd targets of the nodes' probe ports, in the order the ports are given: each carries the node's
    `instance` and the blackbox_exporter module and target that probe it (`__param_*`)."""
    targets: list[dict[str, object]] = []
    for offset, (name, node) in enumerate(fleet.nodes.items()):
        address = f"{host}:{first_port + offset}"
        targets.append({"targets": [address], "labels": {
            **labels, **node.places, "instance": name, "__param_target": address, "__param_module": MODULE}})
    return targets


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A connection accepted is all a probe asks; it is closed at once."""
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def keep_probe_ports(fleet: Fleet, clock: Callable[[], float], host: str | None, first_port: int) -> None:
    """Open each node's port while it is reachable and close it while it is not, until cancelled."""
    servers: dict[str, asyncio.Server] = {}
    refused: set[str] = set()  # Ports another program holds, said once each.
    ports = {name: first_port + offset for offset, name in enumerate(fleet.nodes)}
    try:
        while True:
            now = clock()
            for name, node in fleet.nodes.items():
                up = not node.state.down_at(now)
                if up and name not in servers:
                    try:
                        servers[name] = await asyncio.start_server(_refuse, host, ports[name])
                    except OSError as err:  # The node then reads as down, and the log says why, once.
                        if name not in refused:
                            log.warning("cannot open the probe port %d of %s: %s", ports[name], name, err.strerror)
                        refused.add(name)
                elif not up and name in servers:
                    servers.pop(name).close()
            await asyncio.sleep(CHECK_SECONDS)
    finally:
        for server in servers.values():
            server.close()
