"""The Slurm controller, through the `scontrol` and `sinfo` commands a site already has and trusts.

Every call has a timeout. A controller that does not answer (down, slow, munge refusing) raises
`SlurmUnavailable`, which the caller retries; a node Slurm does not know raises `UnknownNode`, which no retry
mends. Drains are written with a reason that starts with `REASON_PREFIX`: that is how gpufleet tells its own
drains from an operator's, across its own restarts.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from gpufleet.remediate import command

REASON_PREFIX = "gpufleet: "
_UNKNOWN = ("invalid node name", "node not found", "unable to find node")


class SlurmError(Exception):
    """A Slurm call failed; the message has the command's own words."""


class SlurmUnavailable(SlurmError):
    """The controller did not answer in time, or refused the call: worth trying again later."""


class UnknownNode(SlurmError):
    """Slurm has no node of that name."""


@dataclass(frozen=True)
class Node:
    """What a drain decision needs of a node: its state flags (`IDLE`, `DRAIN`, `MAINTENANCE`, ...), its reason, its
    partitions, and whether its slurmd answers the controller (Slurm's `*` after the state)."""

    name: str
    states: frozenset[str]
    reason: str
    partitions: tuple[str, ...]
    responding: bool = True

    @property
    def drained(self) -> bool:
        """Drained or draining: the scheduler places nothing new on it."""
        return "DRAIN" in self.states

    @property
    def ours(self) -> bool:
        """Drained by gpufleet, as the reason it wrote says."""
        return self.drained and self.reason.startswith(REASON_PREFIX)


def parse_nodes(text: str) -> dict[str, Node]:
    """`scontrol show node -o` (one node per line of `Key=Value` words; a reason may hold spaces and comes
    last but for its time and user)."""
    nodes: dict[str, Node] = {}
    for line in text.splitlines():
        fields = _fields(line)
        if "NodeName" not in fields:
            continue
        state = fields.get("State", "")
        states = frozenset(part for part in state.replace("*", "").split("+") if part)
        partitions = tuple(p for p in fields.get("Partitions", "").split(",") if p)
        nodes[fields["NodeName"]] = Node(fields["NodeName"], states, fields.get("Reason", ""), partitions,
                                         responding="*" not in state)
    return nodes


def _fields(line: str) -> dict[str, str]:
    """`Key=Value` words, where a value runs on (spaces and all) to the next word that is a `Key=`."""
    fields: dict[str, str] = {}
    key = None
    for word in line.split(" "):
        name, equals, value = word.partition("=")
        if equals and name and name[0].isupper() and name.isalnum():
            key = name
            fields[key] = value
            if key == "Reason":  # The last field: the rest of the line is the reason's, `=` or not.
                fields[key] = line.split(" Reason=", 1)[-1].rstrip()
                break
        elif key is not None and word:
            fields[key] += " " + word
    if "Reason" in fields:  # `Reason=text [user@2026-11-26T22:39:41]`: the text alone.
        text, _, stamp = fields["Reason"].rpartition(" [")
        fields["Reason"] = text if text and stamp.endswith("]") else fields["Reason"]
    return fields


@dataclass(frozen=True)
class Reservation:
    """A reservation, as far as maintenance goes: its nodes (a Slurm hostlist), its stated end (Unix seconds; none
    for one Slurm gives no end), whether it is a maintenance reservation (`Flags=MAINT`) and whether it holds its
    nodes now (`State=ACTIVE`) rather than later."""

    name: str
    hostlist: str
    end: float | None
    maintenance: bool
    active: bool


def parse_reservations(text: str) -> list[Reservation]:
    """`scontrol show reservation -o`, whose times are the local time of the host that runs it."""
    found = []
    for line in text.splitlines():
        fields = _fields(line)
        if "ReservationName" not in fields:
            continue  # "No reservations in the system".
        try:
            end: float | None = datetime.datetime.fromisoformat(fields.get("EndTime", "")).timestamp()
        except ValueError:
            end = None
        flags = fields.get("Flags", "").split(",")
        found.append(Reservation(fields["ReservationName"], fields.get("Nodes", ""), end, "MAINT" in flags,
                                 fields.get("State") == "ACTIVE"))
    return found


class Slurm:
    """`scontrol` and `sinfo` with a timeout on every call; `SLURM_CONF` and munge come from the environment,
    as for any Slurm client on the host."""

    def __init__(self, scontrol: str = "scontrol", timeout: float = 20.0) -> None:
        self.scontrol = scontrol
        self.timeout = timeout

    async def _run(self, *args: str) -> str:
        try:
            status, out, error = await command.run([self.scontrol, *args], self.timeout)
        except TimeoutError:  # First: TimeoutError is an OSError.
            raise SlurmUnavailable(f"scontrol {args[0]} {args[1]}: no answer in {self.timeout:g}s") from None
        except OSError as err:
            raise SlurmUnavailable(f"cannot run {self.scontrol}: {err}") from None
        if status != 0:
            message = (error or out).strip().replace("\n", "; ")
            if any(words in message.lower() for words in _UNKNOWN):
                raise UnknownNode(message)
            raise SlurmUnavailable(f"scontrol {args[0]} {args[1]} exited {status}: {message}")
        return out

    async def nodes(self) -> dict[str, Node]:
        return parse_nodes(await self._run("show", "node", "-o"))

    async def node(self, name: str) -> Node:
        nodes = parse_nodes(await self._run("show", "node", "-o", name))
        if name not in nodes:
            raise UnknownNode(f"Slurm has no node {name!r}")
        return nodes[name]

    async def maintenance_ends(self) -> dict[str, float]:
        """Each node held by an active maintenance reservation now, with the latest end stated for it."""
        ends: dict[str, float] = {}
        for reservation in parse_reservations(await self._run("show", "reservation", "-o")):
            if not (reservation.maintenance and reservation.active and reservation.hostlist
                    and reservation.end is not None):
                continue
            for name in (await self._run("show", "hostnames", reservation.hostlist)).split():
                ends[name] = max(reservation.end, ends.get(name, reservation.end))
        return ends

    async def drain(self, name: str, reason: str) -> None:
        """Drain the node; on a drained node, rewrite its reason (it stays drained)."""
        await self._run("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")

    async def resume(self, name: str) -> None:
        await self._run("update", f"NodeName={name}", "State=RESUME")
