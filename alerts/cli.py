"""`gpufleet alerts build`: regenerate the committed rule files, or check that they are current; and
`gpufleet alerts topology`: a site's topology as scrape targets or relabelling."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet import checkout, topology
from gpufleet.alerts import config
from gpufleet.alerts.rules import ENGINES, LAYERS, Engine, Layer, render
from gpufleet.flags import regex

# The committed files, by engine and layer; the packaged copies beside the code are read, never written.
COMMITTED: dict[tuple[Engine, Layer], str] = {
    ("prometheus", "core"): "gpufleet-rules.yml", ("vmalert", "core"): "gpufleet-vmalert-rules.yml",
    ("prometheus", "dcgm"): "gpufleet-dcgm-rules.yml", ("vmalert", "dcgm"): "gpufleet-dcgm-vmalert-rules.yml"}
RULES_FILE = Path(__file__).parent / COMMITTED["prometheus", "core"]
VMALERT_RULES_FILE = Path(__file__).parent / COMMITTED["vmalert", "core"]
DCGM_RULES_FILE = Path(__file__).parent / COMMITTED["prometheus", "dcgm"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("alerts", help="build the Prometheus and vmalert rules",
                                   description="Generate the alerting and recording rules from alerts/rules.py.")
    commands = parser.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)
    build = commands.add_parser("build", help=f"write {', '.join(COMMITTED.values())}")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if a file it would write is out of date")
    build.add_argument("--engine", choices=ENGINES,
                       help="build for this evaluator only (default: both committed files, or prometheus with "
                            "--output); vmalert's file adds each group's `concurrency`, which Prometheus refuses")
    build.add_argument("--output", type=Path, metavar="FILE",
                       help="write one file here instead of the committed ones")
    build.add_argument("--layer", choices=LAYERS,
                       help="build this layer only: core, gpufleet's rules, or dcgm, the opt-in dcgm-exporter "
                            "compatibility layer (default: both, or core with --output)")
    build.add_argument("--output-dir", type=Path, metavar="DIR",
                       help="where the committed files go (default: alerts/ of the checkout this runs in)")
    config.add_argument(build)
    build.add_argument("--time-scale", type=_time_scale, default=1.0, metavar="FACTOR",
                       help="divide every window and `for` duration by FACTOR, for tests against a fast "
                            "simulated fleet; never for production (default: 1)")
    build.set_defaults(handler=run_build)
    places = commands.add_parser("topology", help="turn a topology file into scrape targets or relabelling",
                                 description="Each node's rack and leaf switch as labels on its series, so that "
                                             "the rules and routing can see a leaf switch fail as one incident.")
    places.add_argument("file", type=Path, nargs="?", metavar="TOPOLOGY",
                        help="YAML: nodes: {NODE: {rack: R, leaf: L}}")
    places.add_argument("--ibnetdiscover", type=Path, metavar="FILE",
                        help="instead of TOPOLOGY, place each host at the leaf its HCAs are cabled to, from the "
                             "output of ibnetdiscover (HCA descriptions HOST DEVICE, as rdma-ndd sets them)")
    places.add_argument("--device-exclude", type=regex, metavar="REGEX",
                        help="with --ibnetdiscover: HCAs to leave out, the whole device name matching (mlx5_8, "
                             "mlx5_[89]), such as a storage HCA on leaves of its own")
    places.add_argument("--format", choices=("file-sd", "relabel", "yaml"), default="file-sd",
                        help="file-sd: Prometheus file_sd targets; relabel: relabel_configs for a scrape job with "
                             "its own discovery; yaml: the topology file itself, a draft to commit and add racks to "
                             "(default: %(default)s)")
    places.add_argument("--port", type=int, default=19400,
                        help="the exporters' port, for file-sd (default: %(default)s)")
    places.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                        help="another label on every target, for file-sd (a cluster; repeatable)")
    places.add_argument("--source-label", default="__address__", metavar="LABEL",
                        help="the label holding the node's name, for relabel (default: %(default)s; "
                             "__meta_kubernetes_pod_node_name for a DaemonSet's pods)")
    places.set_defaults(handler=run_topology)


def _time_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time scale {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"time scale {text!r} must be from 1 to 1000")
    return value


def targets(engine: Engine | None, layer: Layer | None, output: Path | None,
            directory: Path | None) -> dict[tuple[Engine, Layer], Path] | None:
    """Where each engine's and layer's file goes: --output names one file (Prometheus's core rules unless --engine
    and --layer say otherwise); otherwise the committed names in --output-dir or the checkout's alerts/. None: no
    checkout to write into."""
    if output is not None:
        return {(engine or "prometheus", layer or "core"): output}
    if directory is None:
        root = checkout.find()
        if root is None:
            return None
        directory = root / "alerts"
    return {(e, lay): directory / name for (e, lay), name in COMMITTED.items() if engine in (None, e)
            and layer in (None, lay)}


def write(files: dict[tuple[Engine, Layer], Path], scaled: config.Config, check: bool) -> list[Path]:
    """Write each engine's and layer's rules to its file, or with `check` only compare; returns the stale files."""
    stale = []
    for (engine, layer), path in files.items():
        text = render(scaled, engine, layer)
        if not check:
            path.write_text(text, encoding="utf-8")
        elif (path.read_text(encoding="utf-8") if path.exists() else "") != text:
            stale.append(path)
    return stale


def run_build(args: argparse.Namespace) -> int:
    files = targets(args.engine, args.layer, args.output, args.output_dir)
    if files is None:
        print("gpufleet alerts build: not in a gpufleet checkout; give --output FILE or --output-dir DIR",
              file=sys.stderr)
        return 2
    try:
        stale = write(files, args.config.scaled(args.time_scale), args.check)
    except config.ConfigError as err:
        print(f"gpufleet alerts build: error: {err}", file=sys.stderr)
        return 2
    for path in stale:
        print(f"gpufleet alerts build: {path} is out of date; run `gpufleet alerts build`", file=sys.stderr)
    return 1 if stale else 0


def _places(args: argparse.Namespace) -> topology.Topology:
    """The topology the command was given: a topology file, or ibnetdiscover's output."""
    if (args.file is None) == (args.ibnetdiscover is None):
        raise topology.TopologyError("give either a TOPOLOGY file or --ibnetdiscover FILE")
    if args.file is not None:
        return topology.load(args.file)
    try:
        text = args.ibnetdiscover.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise topology.TopologyError(f"{args.ibnetdiscover}: cannot read: {err.strerror}") from None
    found = topology.from_ibnetdiscover(text, str(args.ibnetdiscover), args.device_exclude)
    for port in found.skipped:
        print(f"gpufleet alerts topology: left out {port}", file=sys.stderr)
    return found.topology


def run_topology(args: argparse.Namespace) -> int:
    try:
        places = _places(args)
    except topology.TopologyError as err:
        print(f"gpufleet alerts topology: error: {err}", file=sys.stderr)
        return 2
    if args.format == "yaml":
        sys.stdout.write(topology.to_yaml(places))
        return 0
    if args.format == "relabel":
        sys.stdout.write(topology.relabel_configs(places, args.source_label))
        return 0
    extra = dict(label.partition("=")[::2] for label in args.label)
    if any(not name or not value for name, value in extra.items()):
        print("gpufleet alerts topology: error: --label takes NAME=VALUE", file=sys.stderr)
        return 2
    sys.stdout.write(topology.file_sd(places, args.port, extra))
    return 0
