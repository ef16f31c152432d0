"""`gpufleet simulate`: flags, start-up and the serving loop of the fleet simulator."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from pathlib import Path

from aiohttp import web

from gpufleet import topology
from gpufleet.alerts import node_exporter
from gpufleet.exporter.server import serve_until_signalled
from gpufleet.flags import duration, listen_address, number_in, positive_int
from gpufleet.logfmt import configure_logging
from gpufleet.simulator.faults import ScenarioError, load_scenario
from gpufleet.simulator.fleet import Fleet, collector_flags, node_names
from gpufleet.simulator.layout import Job, LayoutError, load_layout
from gpufleet.simulator.probes import keep_probe_ports, probe_targets
from gpufleet.simulator.rates import load_rates
from gpufleet.simulator.server import SimClock, build_app, file_sd_targets, missed_scrapes, write_file_sd

log = logging.getLogger(__name__)
MAX_PORT = 65535


def _label(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier() or name.startswith("__"):
        raise argparse.ArgumentTypeError(f"invalid label {text!r} (use NAME=VALUE)")
    return name, value


def _mig(text: str) -> tuple[str, int, list[str]]:
    """NODE:GPU=PROFILE,... : one board in MIG mode with a GPU instance per profile."""
    where, sep, profiles = text.partition("=")
    node, colon, gpu = where.rpartition(":")
    if not sep or not colon or not gpu.isdigit() or not profiles:
        raise argparse.ArgumentTypeError(f"invalid MIG layout {text!r} (use NODE:GPU=PROFILE,..., for example "
                                         "gpu-node-0001:0=3g.40gb,2g.20gb,1g.10gb)")
    return node, int(gpu), profiles.split(",")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate", help="serve a simulated GPU fleet",
        description="Serve the /metrics of many simulated GPU nodes, rendered by the exporter's own collectors, "
                    "with faults injected from a scenario file or at run time.",
    )
    parser.add_argument("--nodes", type=positive_int, default=4, metavar="N", help="nodes (default: %(default)s)")
    parser.add_argument("--gpus-per-node", type=positive_int, default=8, metavar="G",
                        help="GPUs per node (default: %(default)s)")
    parser.add_argument("--web.listen-address", dest="listen_address", type=listen_address, default=":19500",
                        metavar="HOST:PORT", help="address to serve on (default: %(default)s)")
    parser.add_argument("--file-sd", dest="file_sd", metavar="PATH",
                        help="write Prometheus file_sd targets here, one per node")
    parser.add_argument("--file-sd.address", dest="file_sd_address", metavar="HOST:PORT",
                        help="address Prometheus should scrape (default: the listen address, 127.0.0.1 for :PORT)")
    parser.add_argument("--cluster", default="sim", help="cluster label on every target (default: %(default)s)")
    parser.add_argument("--label", dest="labels", type=_label, action="append", default=[], metavar="NAME=VALUE",
                        help="another static label on every target (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of identities, jobs and noise (default: %(default)s)")
    parser.add_argument("--speed", type=number_in("speed", 0, 1000), default=1.0,
                        help="simulated seconds per wall-clock second (default: %(default)s)")
    parser.add_argument("--scenario", metavar="FILE", help="YAML file of faults to inject")
    parser.add_argument("--fault-rates", dest="fault_rates", metavar="FILE",
                        help="YAML file of fault rates per GPU-, port- or node-day to draw faults from, seeded by "
                             "--seed (simulator/fault-rates/llama3.yml is Llama 3's)")
    parser.add_argument("--fault-rates.horizon", dest="fault_horizon", type=duration, default=duration("30d"),
                        metavar="DURATION", help="draw faults from the rates for this much simulated time "
                                                 "(default: 30d)")
    parser.add_argument("--storage-hca", dest="storage_hca", action="store_true",
                        help="every node also has a storage HCA (mlx5_8) of another model, at 200 Gb/s where the "
                             "training HCAs run at 400")
    parser.add_argument("--topology", metavar="FILE",
                        help="YAML file of each node's place (rack, leaf), as `gpufleet alerts topology` reads it: "
                             "labels on its targets, and the leaves a switch_down fault takes down")
    parser.add_argument("--layout", metavar="FILE",
                        help="YAML file naming each job and its nodes (default: drawn from --seed)")
    parser.add_argument("--mig", dest="mig", type=_mig, action="append", default=[], metavar="NODE:GPU=PROFILE,...",
                        help="put a GPU in MIG mode with a GPU instance per profile, its node's job in the first "
                             "(repeatable; for example gpu-node-0001:0=3g.40gb,2g.20gb,1g.10gb)")
    parser.add_argument("--job-lifetime", dest="job_lifetime", type=duration, metavar="DURATION",
                        help="jobs end after this long on average, and new jobs, on most of the same nodes, take "
                             "their place after a short gap (default: jobs never end)")
    parser.add_argument("--missed-scrapes", dest="missed_scrapes", default=0.0, metavar="SHARE",
                        type=number_in("share", 0, 1, low_included=True, high_included=False),
                        help="share of scrapes answered with an error, drawn from --seed (default: none)")
    parser.add_argument("--node-exporter-root", dest="node_exporter_root", type=Path, metavar="DIR",
                        help="write each node's sysfs and procfs to DIR/<node>/sys and DIR/<node>/proc for a "
                             "node_exporter to read, and run its exporter as beside one (docs: "
                             "exporter/node-exporter.md)")
    parser.add_argument("--collect-interval", type=duration, default=15.0, metavar="DURATION",
                        help="collect every node once per this interval, spread over it, no collector of a node less "
                             "often; scrapes are served from the latest collection (default: %(default)gs)")
    parser.add_argument("--probe-ports", dest="probe_ports", type=positive_int, metavar="FIRST",
                        help="give each node a TCP port, FIRST and up in the order of the nodes, open while the node "
                             "is up and closed while it reboots or is down, for blackbox_exporter to probe")
    parser.add_argument("--probe-sd", dest="probe_sd", metavar="PATH",
                        help="write Prometheus file_sd targets of the probe ports here (needs --probe-ports)")
    parser.add_argument("--control.allow-remote", dest="allow_remote_control", action="store_true",
                        help="let non-loopback clients use /control/faults (default: loopback only)")
    parser.add_argument("--log.level", dest="log_level", choices=("debug", "info", "warn", "error"), default="info",
                        help="least severe log level written (default: %(default)s)")
    parser.set_defaults(handler=run)


def _read(path: str, error: type[ValueError]) -> str:
    """A layout, scenario or fault-rates file's text, or `error` saying why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as err:
        raise error(f"cannot read: {err.strerror}") from None


def _layout(path: str, nodes: int) -> list[Job]:
    return load_layout(_read(path, LayoutError), node_names(nodes))


def _add_faults(args: argparse.Namespace, fleet: Fleet) -> None:
    """The scenario's faults and those drawn from fault rates; a ScenarioError names the file at fault."""
    if args.scenario:
        try:
            fleet.add(load_scenario(_read(args.scenario, ScenarioError), fleet.nodes, fleet.gpus_per_node, fleet.ids))
        except ScenarioError as err:
            raise ScenarioError(f"scenario {args.scenario}: {err}") from None
    if args.fault_rates:
        try:
            rates = load_rates(_read(args.fault_rates, ScenarioError))
        except ScenarioError as err:
            raise ScenarioError(f"fault rates {args.fault_rates}: {err}") from None
        fleet.add(fleet.draw_faults(rates, args.fault_horizon, args.seed))


def _faults_and_targets(args: argparse.Namespace, fleet: Fleet, address: str) -> str | None:
    """The faults asked for, and the file_sd targets of the nodes' exporters and of their probe ports; what failed,
    if anything did."""
    try:
        _add_faults(args, fleet)
    except ScenarioError as err:
        return str(err)
    if args.probe_ports and args.probe_ports + len(fleet.nodes) - 1 > MAX_PORT:
        return f"--probe-ports {args.probe_ports}: {len(fleet.nodes)} nodes need ports past {MAX_PORT}"
    labels = {"cluster": args.cluster, **dict(args.labels)}
    wanted = [(args.file_sd, file_sd_targets(fleet, address, labels))] if args.file_sd else []
    if args.probe_sd:
        wanted.append((args.probe_sd, probe_targets(fleet, address.rpartition(":")[0], args.probe_ports, labels)))
    for path, targets in wanted:
        try:
            write_file_sd(path, targets)
        except OSError as err:
            return f"cannot write {path}: {err.strerror}"
    return None


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    # Every node would log the same NVML start-up lines; a thousand copies say nothing more.
    logging.getLogger("gpufleet.exporter.gpu").setLevel(max(logging.WARNING, logging.getLogger().level))
    host, port = args.listen_address
    if args.probe_sd and not args.probe_ports:
        print("gpufleet simulate: error: --probe-sd needs --probe-ports", file=sys.stderr)
        return 1
    try:
        layout = _layout(args.layout, args.nodes) if args.layout else None
    except LayoutError as err:
        print(f"gpufleet simulate: error: layout {args.layout}: {err}", file=sys.stderr)
        return 1
    beside = node_exporter.EXPORTER_FLAGS if args.node_exporter_root else ()
    fleet = Fleet(args.nodes, args.gpus_per_node, seed=args.seed, layout=layout, job_lifetime=args.job_lifetime,
                  exporter_flags=collector_flags(args.collect_interval, *beside), storage_hca=args.storage_hca,
                  mirror_root=args.node_exporter_root)
    if args.topology:
        try:
            fleet.place(topology.load(args.topology).nodes)
        except (topology.TopologyError, ValueError) as err:
            print(f"gpufleet simulate: error: topology {args.topology}: {err}", file=sys.stderr)
            fleet.close()
            return 1
    for node, gpu, profiles in args.mig:
        try:
            fleet.split(node, gpu, profiles)
        except ValueError as err:
            print(f"gpufleet simulate: error: --mig {node}:{gpu}: {err}", file=sys.stderr)
            fleet.close()
            return 1
    address = args.file_sd_address or f"{host if host not in (None, '0.0.0.0', '::') else '127.0.0.1'}:{port}"
    error = _faults_and_targets(args, fleet, address)
    if error:
        print(f"gpufleet simulate: error: {error}", file=sys.stderr)
        fleet.close()
        return 1
    fleet.start()
    # A thousand nodes keep millions of long-lived objects; scanning them on every young collection is
    # most of what the collector would cost. Freeze what start-up built and collect young objects less often.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    try:
        app = build_app(fleet, clock := SimClock(args.speed), args.allow_remote_control,
                        missed=missed_scrapes(args.missed_scrapes, args.seed))
        asyncio.run(serve(app, fleet, clock, host, port, args.collect_interval, args.probe_ports))
    except OSError as err:
        print(f"gpufleet simulate: error: cannot listen on {host or '*'}:{port}: {err.strerror or err}",
              file=sys.stderr)
        return 1
    finally:
        fleet.close()
    return 0


async def serve(app: web.Application, fleet: Fleet, clock: SimClock, host: str | None, port: int,
                collect_interval: float, probe_ports: int | None) -> None:
    probes = [keep_probe_ports(fleet, clock, host or None, probe_ports)] if probe_ports else []
    await serve_until_signalled(
        app, host, port,
        background=lambda: [fleet.collect_forever(clock, collect_interval), *probes],
        ready=lambda: log.info("simulating %d nodes of %d GPUs, %d jobs, %d faults; listening on %s:%d",
                               len(fleet.nodes), fleet.gpus_per_node, len(fleet.jobs), len(fleet.faults),
                               host or "*", port),
        log=log,
        shutdown_timeout=2.0,  # Scrapes held by a simulated "exporter down" are not worth waiting for.
    )
