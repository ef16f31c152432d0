"""`python -m gpufleet.devtools generate [--check]`: regenerate, or check, everything generated from the code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet.devtools.generate import ARTIFACTS, generate
from gpufleet.devtools.paths import checkout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.devtools",
                                     description="Tools for working on gpufleet from a checkout.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    build = commands.add_parser("generate", help="regenerate the rules, dashboards, golden exposition and docs pages")
    build.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every file that is stale")
    build.add_argument("--root", type=Path, help="the checkout to write into (default: the one this code is in)")
    build.add_argument("--only", action="append", default=[], choices=[a.name for a in ARTIFACTS],
                       metavar="ARTIFACT", help="only this artifact (repeatable): "
                                                + ", ".join(a.name for a in ARTIFACTS))
    args = parser.parse_args(argv)
    root = args.root or checkout()
    changed = generate(root, args.check, tuple(args.only))
    verb = "stale" if args.check else "written"
    for path in changed:
        print(f"{verb}: {path}", file=sys.stderr)
    if args.check and changed:
        print("run `python -m gpufleet.devtools generate` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
