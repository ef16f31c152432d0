"""The exporter on a real GPU: its values against nvidia-smi, its cost, GPM under load, and what the pager reads.

Usage, on a machine with NVIDIA GPUs, from a checkout (see docs/development.md, "A real GPU"):
    PYTHONPATH=. python3 bench/gpu_check.py --out DIR
and here, over the simulated NVML, the same code path:
    .venv/bin/python bench/gpu_check.py --out DIR --gpu.backend=sim

In at most five minutes it:

* starts `gpufleet exporter` on the GPUs and compares each field of one scrape with `nvidia-smi --query-gpu`
  read a moment later, with the tolerance each field needs, once idle and once under load;
* asks every NVML call and field the exporter uses of every GPU, one at a time, and lists what the driver
  refuses, in the names the simulated board's `unsupported` set takes;
* reads the recovery-action field (230), the event types each GPU can report, NVSwitch fabric registration,
  and whether the XID watcher registers;
* reads GPM (SM, tensor and DRAM activity) idle and under a bf16 matrix-multiply loop on each GPU (PyTorch),
  and checks that tensor activity rises;
* times the GPU collection as the exporter runs it (mean and p99 over --rounds), each NVML call, and
  `nvidia-smi --query-gpu` on the same GPUs;
* runs the tests marked `gpu`.

It writes DIR/gpu_check.json (a record in the format of bench/results/, with every figure, comparison and
refusal), the scrapes, the exporter's log and the tests' output to DIR, and prints a short summary. A part that
cannot run says why in one line; a part that breaks is reported and the next one runs. The exit status is 1
where a part broke or a check failed.

Back here, `--merge DIR/gpu_check.json --commit REV` appends that record to bench/results/gpu_check.json, with
the commit whose tree ran: the GPU machine gets the files without their history.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gpufleet.devtools import gpucheck, results


def merge(source: Path, commit: str, target: Path) -> None:
    """Append the runs of a record written on a GPU machine to `target`."""
    runs = results.load(source)
    for run in runs:
        if commit:
            run["commit"], run["changed"] = commit, False
    results.append("gpu_check", runs, target)
    print(f"{len(runs)} run(s) appended to {target}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for gpu_check.json, scrapes and logs")
    parser.add_argument("--merge", type=Path, metavar="FILE",
                        help="append the runs of a gpu_check.json from a GPU machine to bench/results, and run nothing")
    parser.add_argument("--commit", default="", metavar="REV", help="with --merge: the commit whose tree ran")
    results.add_argument(parser)
    parser.add_argument("--gpu.backend", dest="backend", choices=("nvml", "sim"), default="nvml",
                        help="nvml: this machine's GPUs; sim: the simulated NVML (default: %(default)s)")
    parser.add_argument("--sim.gpus", dest="sim_gpus", type=int, default=2, help="simulated GPUs (default: 2)")
    parser.add_argument("--rounds", type=int, default=200, help="GPU collections timed (default: 200)")
    parser.add_argument("--calls", type=int, default=50, help="calls timed per NVML call and GPU (default: 50)")
    parser.add_argument("--quiet-seconds", type=float, default=30.0,
                        help="how long the exporter's CPU is measured at its default flags (default: 30)")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.commit, args.results or results.RESULTS / "gpu_check.json")
        return 0
    if args.out is None:
        parser.error("--out DIR is needed to run the check")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = gpucheck.Options(out=args.out, backend=args.backend, sim_gpus=args.sim_gpus, rounds=args.rounds,
                               calls=args.calls, quiet_seconds=args.quiet_seconds)
    report = gpucheck.run(options)
    notes = "; ".join([*(f"skipped: {s}" for s in report.skipped), *(f"failed: {s}" for s in report.failures),
                       *(f"error: {s}" for s in report.errors)])
    figures = {**report.figures, **{f"seconds: {name}": took for name, took in report.timings.items()}}
    results.record("gpu_check", figures, report.tables, notes=notes, path=args.results or args.out / "gpu_check.json")
    print(report.summary())
    return 1 if report.errors or report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
