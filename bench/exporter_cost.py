"""The exporter's CPU on an 8-GPU H200 node at its default flags, projected without a GPU.

Usage: .venv/bin/python bench/exporter_cost.py [--seconds 120] [--record FILE]

Three parts, added:

* the NVML calls one collection makes, counted over simulated boards made to answer as the H200 of the latest
  `bench/gpu_check.py` record did (what its driver refused, its NVLinks), priced at the CPU each took there: in
  the collector's own order where the record has that table, else each call timed alone. A call no GPU has
  timed is priced at a stand-in (`gpufleet/devtools/costmodel.py`), and named;
* the GPU collector's own work around those calls (the checks, the families, the rendering), measured in this
  process over the same boards, as the exporter builds the collector;
* the rest of the process, measured here: the exporter without its GPU collector, at its default flags, on a
  node-sized sysfs tree, scraped every 15 s.

It also measures the exporter over 8 simulated GPUs (its CPU and its memory, which with NVML's own heap and
mapped files from the record is the node's), prints the projection, its parts and the dearest calls, and
appends figures and the table of calls to bench/results/exporter_cost.json. A second projection gives the
boards 18 NVLinks each, as on an HGX board, whose link calls the H200 measured so far could not time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from gpufleet.devtools import results
from gpufleet.devtools.costmodel import Costs, Projection, board_like, collector_share, count_calls, project
from gpufleet.devtools.gpucheck import at_rest
from gpufleet.devtools.nodes import write_bench_sysfs
from gpufleet.devtools.programs import exporter
from gpufleet.devtools.resources import peak_rss_mib, status_mib
from gpufleet.exporter import node

GPUS = 8
TARGET = 0.008  # What the projection is held to, a share of one core: room within the exporter's budget.
WARM_UP = 15.0  # Seconds of the exporter's start left out of its CPU.


def latest_gpu_record(path: Path) -> dict:
    """The newest gpu_check record made on a real GPU."""
    runs = [run for run in results.load(path) if run.get("figures", {}).get("backend") == "nvml"]
    if not runs:
        sys.exit(f"{path} holds no record made on a GPU: run bench/gpu_check.py on one first")
    return runs[-1]


def measured(seconds: float, *flags: str) -> dict[str, float]:
    """The exporter over 8 simulated GPUs at its default flags and `flags`: its CPU share and its memory."""
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = Path(tmp) / "sys"
        write_bench_sysfs(sysfs)
        with exporter("--log.level=warn", *flags, gpus=GPUS, sysfs=sysfs) as server:
            at_rest(server, WARM_UP)  # Past the first collections, which open the GPUs and read every tier.
            share = at_rest(server, seconds)
            memory = status_mib(server.pid)
            return {"CPU (share of a core)": share, "peak RSS (MiB)": peak_rss_mib(server.pid),
                    "RssAnon (MiB)": memory.get("RssAnon", 0.0), "RssFile (MiB)": memory.get("RssFile", 0.0)}


def lines_table(projection: Projection, interval: float) -> results.Table:
    """Each call's part of the projection, dearest first."""
    table = results.Table(["tier", "call", "calls per GPU and collection", "CPU per call (µs)",
                           "8 GPUs (share of a core)", "priced at"])
    for line in sorted(projection.lines, key=lambda line: -line.weight * line.calls * line.seconds):
        share = line.weight * line.calls * line.seconds * projection.gpus / interval
        table.add(line.tier, line.call, round(line.calls, 3), round(1e6 * line.seconds, 1), round(share, 5),
                  line.stand_in or "measured")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="how long the simulated exporter's CPU is measured (default: %(default)g)")
    parser.add_argument("--record", type=Path, default=results.RESULTS / "gpu_check.json",
                        help="the gpu_check records to price the calls from (default: %(default)s)")
    results.add_argument(parser)
    args = parser.parse_args()
    record = latest_gpu_record(args.record)
    costs = Costs.from_record(record)
    interval = node.defaults().collector_gpu_interval
    simulated = measured(args.seconds)
    rest = measured(args.seconds, "--no-collector.gpu")["CPU (share of a core)"]
    projections = {}
    for name, links in (("as measured", None), ("with 18 NVLinks a GPU", 18)):
        boards = board_like(record, GPUS)
        for board in boards:
            board.nvlinks = board.nvlinks if links is None else links
        projections[name] = project(count_calls(boards), costs, collector=collector_share(boards), rest=rest,
                                    gpus=GPUS, interval=interval)
    main_projection = projections["as measured"]
    print(f"calls priced from: {costs.source}")
    print(f"simulated exporter, 8 GPUs, default flags, {args.seconds:g} s: "
          f"{simulated['CPU (share of a core)']:.2%} of a core, peak RSS {simulated['peak RSS (MiB)']:.1f} MiB "
          f"(RssAnon {simulated['RssAnon (MiB)']:.1f}, RssFile {simulated['RssFile (MiB)']:.1f}); without the GPU "
          f"collector {rest:.2%}")
    for name, projection in projections.items():
        print(f"projected, 8 x {record['figures'].get('board')} {name}: {projection.total:.2%} of a core "
              f"(NVML {projection.nvml:.2%}, the GPU collector around it {projection.collector:.2%}, the rest "
              f"{projection.rest:.2%}); target {TARGET:.1%}")
    table = lines_table(main_projection, interval)
    print("dearest calls (8 GPUs, share of a core): " + "; ".join(
        f"{row[0]} {row[1]} {float(row[4] or 0):.3%}" for row in table.rows[:8]))
    nvml_mib = sum(float(record["figures"].get(f"NVML loaded and opened: {part} (MiB)", 0.0))
                   for part in ("heap", "mapped files"))
    figures: dict[str, results.Value] = {
        "priced from": costs.source,
        **{f"simulated exporter, 8 GPUs, {key}": round(value, 4) for key, value in simulated.items()},
        "simulated exporter without the GPU collector (share of a core)": round(rest, 4),
        **{f"projected CPU, 8-GPU H200 node at default flags, {name} (share of a core)": round(p.total, 4)
           for name, p in projections.items()},
        "projected NVML calls, 8-GPU H200 node (share of a core)": round(main_projection.nvml, 4),
        "projected GPU collector around the calls, 8 GPUs (share of a core)": round(main_projection.collector, 4),
        "projected peak RSS, 8-GPU H200 node (MiB)": round(simulated["peak RSS (MiB)"] + nvml_mib, 1),
        "calls priced at a stand-in": "; ".join(sorted({f"{line.call} at {line.stand_in}"
                                                        for line in main_projection.lines if line.stand_in}))
        or "none",
    }
    print(f"projected peak RSS: {figures['projected peak RSS, 8-GPU H200 node (MiB)']} MiB (the simulated "
          f"exporter's and NVML's {nvml_mib:.1f} MiB heap and mapped files)")
    results.record("exporter_cost", figures, {"calls, 8-GPU H200 node": table}, path=args.results)


if __name__ == "__main__":
    main()
