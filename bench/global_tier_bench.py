"""The global tier at 100,000 GPUs: vmalert's straggler evaluation over the per-node series of 12,500 nodes.

Usage: .venv/bin/python bench/global_tier_bench.py [--nodes 12500] [--minutes 8]

Past one store, the rules that reduce a node's own series (a GPU's clock, a port's wait, a node's
signal averaged over 5 minutes) run near the data, and only the rules that compare nodes with each
other (job medians, stragglers) must see the whole fleet. This bench takes those from the committed
rule file for vmalert, as compose runs it (these groups ask one rule at a time there): the rules of
the straggler groups (`gpufleet-recording`, `gpufleet-stragglers`) that do not keep nodes apart
(`global_groups` says how that is read from the rules). It writes what they read (the per-node series
recorded near the data, and `up`) for N nodes of 8 GPUs into a single-node VictoriaMetrics 1.79.5
(Debian's), from 12 minutes before the start to 2 minutes past the end at the rate they are recorded
(a minute; `up` every 15 s), so that every window is full from the first evaluation and the store takes
no writes but vmalert's while it is measured. Then vmalert evaluates those groups at their own
interval, with the compose file's flags, for --minutes.

The fleet is one cluster of Slurm jobs: one of 2,048 nodes, two of 1,024, six of 512, twenty of 128
and fifty of 16, as many as fit; of the nodes left, half are busy without a job (compared by GPU
model) and half idle. One node of the largest job runs at 85 % of its peers' clocks and utilisation,
with thermal slowdown named as its cause, and the bench says whether vmalert found it.

It prints, per group, every evaluation's duration (from the sums and counts of vmalert's own
`vmalert_iteration_duration_seconds`, read every 2 s) as p50/max and as a share of the interval,
missed iterations and failed rule executions; the series written; the CPU and peak memory of
VictoriaMetrics and vmalert; and, after vmalert is stopped, each rule's own time: its expression run as
vmalert runs it (an instant query at the last evaluation, with vmalert's step), the median of three,
slowest first, which says where a group's time goes. Everything listens on 127.0.0.1; every loop is
bounded by count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from gpufleet.alerts.cli import VMALERT_RULES_FILE
from gpufleet.alerts.recording import NODES_SEEN, NODES_STALE
from gpufleet.alerts.stragglers import SIGNAL, STEADY
from gpufleet.devtools import results
from gpufleet.devtools.compose import victoria_metrics_flags, vmalert_flags
from gpufleet.devtools.net import get
from gpufleet.devtools.processes import Server
from gpufleet.devtools.programs import alertmanager, victoria_metrics, vmalert
from gpufleet.devtools.prom import VmalertIterations, query_value, rule_times
from gpufleet.devtools.resources import cpu_seconds, peak_rss_mib
from gpufleet.devtools.stats import percentile
from gpufleet.devtools.waiting import HarnessError
from gpufleet.duration import parse as parse_duration

GROUPS = ("gpufleet-recording", "gpufleet-stragglers")
CLUSTER = "global"
JOB_SIZES = [2048] + [1024] * 2 + [512] * 6 + [128] * 20 + [16] * 50
MODEL = "NVIDIA H100 80GB HBM3"
HISTORY = 12 * 60  # Seconds of series before the start: more than the longest look back (the first-evaluation test).
RECORD_STEP, UP_STEP = 60, 15
SLOW = 0.85  # The straggler's share of its peers' clocks, power and utilisation.
SAMPLE_SECONDS = 2.0


def _unquoted(expr: str) -> str:
    """A PromQL expression with its string literals emptied, so that label values are not read as names."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def exporter_series(expr: str) -> set[str]:
    """The exporter's own series (named gpufleet_..., recorded ones have a colon) that a PromQL expression reads."""
    return set(re.findall(r"(?<![\w:])gpufleet_\w+", _unquoted(expr)))


def recorded_series(expr: str) -> set[str]:
    """The recorded series (level:metric:operations), `up` and `ALERTS` that a PromQL expression reads."""
    return set(re.findall(r"(?<![\w:])([A-Za-z_]\w*:[\w:]+|up|ALERTS)(?=[\s{\[)]|$)", _unquoted(expr)))


def keeps_nodes_apart(rule: dict) -> bool:
    """Whether a rule's result is per node (an alert's is judged by what it reads) and every aggregation in
    it keeps `instance`: then, over per-node inputs, it reads one node's series at a time and can run
    wherever that node's series are."""
    if "instance" not in rule.get("record", "instance").split(":")[0].split("_"):
        return False
    for match in re.finditer(r"\b(?:sum|avg|min|max|count|quantile|group|topk|bottomk|stddev|stdvar)\s*"
                             r"(?:(by|without)\s*\(([^)]*)\))?\s*\(", _unquoted(rule["expr"])):
        kind, labels = match.group(1), {label.strip() for label in (match.group(2) or "").split(",")}
        if kind is None or (kind == "by") != ("instance" in labels):
            return False
    return True


def global_groups(rules: dict) -> dict:
    """The rules of GROUPS that compare nodes with each other, in their groups, order and intervals.

    A rule runs near the data, and is left out, when it keeps nodes apart and reads only exporter series or
    series recorded near the data. A name recorded by several rules is near only if all of them are.
    """
    every = [rule for group in rules["groups"] for rule in group["rules"]]
    near = {rule["record"] for rule in every if "record" in rule}

    def runs_near(rule: dict) -> bool:
        return keeps_nodes_apart(rule) and recorded_series(rule["expr"]) - {"up"} <= near

    while far := {rule["record"] for rule in every if "record" in rule and not runs_near(rule)} & near:
        near -= far
    groups = []
    for group in rules["groups"]:
        if group["name"] in GROUPS:
            kept = [rule for rule in group["rules"] if not runs_near(rule)]
            if any(exporter_series(rule["expr"]) for rule in kept):
                raise SystemExit(f"a rule of {group['name']} compares nodes over exporter series")
            # The file's concurrency, capped at the rules kept: the global part of the recording group is one rule.
            groups.append({**group, "concurrency": min(group["concurrency"], len(kept)), "rules": kept})
    return {"groups": groups}


def read_series(groups: dict) -> set[str]:
    """The series the groups read and do not record themselves: what the near tier must deliver."""
    recorded = {rule["record"] for group in groups["groups"] for rule in group["rules"] if "record" in rule}
    read = {name for group in groups["groups"] for rule in group["rules"] for name in recorded_series(rule["expr"])}
    return read - recorded - {"ALERTS"}


@dataclass(frozen=True)
class Node:
    instance: str
    job_id: str | None  # None: no job.
    busy: bool


def fleet(nodes: int) -> list[Node]:
    fleet: list[Node] = []
    job = 0
    for size in JOB_SIZES:
        if len(fleet) + size > nodes:
            continue
        job += 1
        fleet += [Node(f"gpu-node-{len(fleet) + n + 1:05d}", str(100000 + job), True) for n in range(size)]
    rest = nodes - len(fleet)
    fleet += [Node(f"gpu-node-{len(fleet) + n + 1:05d}", None, n < rest // 2) for n in range(rest)]
    return fleet


Series = tuple[dict[str, str], Callable[[float], float]]


def node_series(node: Node, straggler: bool, rng: random.Random) -> Iterator[tuple[str, Series]]:
    """Each per-node series the near tier records for `node`, with a function of time that gives its value."""
    def noisy(level: float, spread: float) -> Callable[[float], float]:
        seed = rng.random()
        return lambda t: level * (1 + spread * random.Random(hash((seed, t))).uniform(-1, 1))

    base = {"cluster": CLUSTER, "instance": node.instance}
    scale = SLOW if straggler else 1.0
    yield "up", ({**base, "job": "gpufleet"}, lambda t: 1.0)
    yield NODES_SEEN, (base, lambda t: t)
    # Eight ports, each waiting about 200,000 ticks a second: the node's sum per job, and its most waiting port.
    yield "instance:gpufleet_infiniband_xmit_wait:max_rate5m", (base, noisy(2.6e5, 0.15))
    if node.job_id:
        yield "job_instance:gpufleet_infiniband_xmit_wait:rate5m", (
            {**base, "scheduler": "slurm", "job_id": node.job_id}, noisy(1.6e6, 0.1))
    if straggler:
        yield "instance:gpufleet_straggler_cause:active", ({**base, "cause": "thermal slowdown"}, lambda t: 0.5)
    if not node.busy:
        return
    peers = ({"scheduler": "slurm", "job_id": node.job_id, "peers": "job"} if node.job_id
             else {"model": MODEL, "peers": "model"})
    for signal, level, spread in (("sm_clock", 1.98e9, 0.003), ("power", 650.0, 0.02), ("utilization", 0.97, 0.01)):
        # Each minute of work, and their median over the signal's window, which is as noisy.
        for name in (STEADY, SIGNAL):
            yield name, ({**base, **peers, "signal": signal}, noisy(level * scale, spread))


def import_lines(fleet_nodes: list[Node], start: float, end: float, wanted: set[str]) -> Iterator[str]:
    """VictoriaMetrics's JSON-lines import of every series in `wanted`, sampled at its recording step."""
    rng = random.Random(0)
    made: set[str] = set()
    for index, node in enumerate(fleet_nodes):
        for name, (labels, value) in node_series(node, index == 0, rng):
            made.add(name)
            step = UP_STEP if name == "up" else RECORD_STEP
            times = [float(t) for t in range(int(start) // step * step, int(end), step)]
            yield json.dumps({"metric": {"__name__": name, **labels}, "values": [round(value(t), 6) for t in times],
                              "timestamps": [int(t * 1000) for t in times]})
    # Only a node whose scraper died without a staleness marker is stale: none here.
    missing = wanted - made - {NODES_STALE}
    if missing:
        raise HarnessError(f"the rules read series this bench does not write: {sorted(missing)}")


def write(vm_url: str, lines: Iterator[str], batch: int = 5000) -> int:
    count, chunk = 0, []
    for line in lines:
        chunk.append(line)
        if len(chunk) == batch:
            count += _post(vm_url, chunk)
            chunk = []
    return count + (_post(vm_url, chunk) if chunk else 0)


def _post(vm_url: str, chunk: list[str]) -> int:
    request = urllib.request.Request(f"{vm_url}/api/v1/import", data="\n".join(chunk).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        if response.status != 204:
            raise HarnessError(f"import answered {response.status}")
    return len(chunk)


def evaluate(workdir: Path, groups: dict[str, Any], nodes: list[Node], minutes: float) -> dict[str, Any]:
    """Write the fleet's history, run vmalert over the global groups for `minutes`, and return what it did."""
    rules = workdir / "global-rules.yml"
    rules.write_text(yaml.safe_dump(groups, sort_keys=False))
    with contextlib.ExitStack() as stack:
        vm = stack.enter_context(victoria_metrics(workdir / "vm", "-loggerLevel=ERROR", *victoria_metrics_flags(),
                                                  timeout=120, output="discard"))
        now = time.time()
        began = time.monotonic()
        written = write(vm.url, import_lines(nodes, now - HISTORY, now + minutes * 60 + 120, read_series(groups)))
        print(f"wrote {written:,} series in {time.monotonic() - began:.0f} s")
        am = stack.enter_context(alertmanager(workdir / "alertmanager", timeout=120))
        evaluator: Server = stack.enter_context(vmalert(rules, vm.url, am.url, "-loggerLevel=ERROR", *vmalert_flags(),
                                                        timeout=120, output="discard"))
        processes = {"victoriametrics": psutil.Process(vm.pid), "vmalert": psutil.Process(evaluator.pid)}
        cpu_before = {name: cpu_seconds(p) for name, p in processes.items()}
        iterations = VmalertIterations(evaluator.url)
        for _ in range(int(minutes * 60 / SAMPLE_SECONDS)):
            time.sleep(SAMPLE_SECONDS)
            iterations.sample()
        measured = {
            "written": written, "iterations": iterations,
            "cpu": {name: (cpu_seconds(p) - cpu_before[name]) / (minutes * 60) for name, p in processes.items()},
            "rss": {name: peak_rss_mib(p.pid) for name, p in processes.items()},
            "alerts": json.loads(get(f"{evaluator.url}/api/v1/alerts"))["data"]["alerts"] or [],
            "recorded": {name: query_value(vm.url, f"count({name})") or 0.0 for name in sorted(
                {rule["record"] for group in groups["groups"] for rule in group["rules"] if "record" in rule})}}
        evaluator.stop()
        at = time.time() // RECORD_STEP * RECORD_STEP  # vmalert aligns its query time to the interval.
        measured["slowest"] = rule_times(vm.url, groups, at)
    return measured


def print_figures(measured: dict[str, Any], intervals: dict[str, float], nodes: list[Node]) -> results.Table:
    iterations: VmalertIterations = measured["iterations"]
    table = results.Table(["group", "interval (s)", "runs", "p50 (s)", "max (s)", "max / interval", "missed"])
    print(f"\n{'group':<22}{'interval':>9}{'runs':>6}{'p50 s':>8}{'max s':>8}{'max/interval':>14}{'missed':>8}")
    for group, interval in intervals.items():
        seen = iterations.durations.get(group, [])
        worst = max(seen, default=float("nan"))
        missed = iterations.since_start("vmalert_iteration_missed_total", group)
        table.add(group, interval, len(seen), percentile(seen, 0.5), worst, worst / interval, missed)
        print(f"{group:<22}{interval:>8.0f}s{len(seen):>6}{percentile(seen, 0.5):>8.2f}{worst:>8.2f}"
              f"{worst / interval:>14.1%}{missed:>8.0f}")
    print(f"failed rule executions: {iterations.since_start('vmalert_execution_errors_total'):.0f}")
    for name, cores in measured["cpu"].items():
        print(f"{name}: {cores:.2f} cores, peak RSS {measured['rss'][name]:.0f} MiB")
    print("series each recording rule wrote at the end: "
          + ", ".join(f"{name} {count:,.0f}" for name, count in measured["recorded"].items()))
    slowest = measured["slowest"]
    print(f"\neach rule's query time, slowest first (sum {sum(t for t, _, _ in slowest):.2f} s):")
    for seconds, group, name in slowest:
        print(f"{seconds:>8.3f} s  {group:<22}{name}")
    found = [(a["labels"].get("instance"), a["labels"].get("signal"), a["state"]) for a in measured["alerts"]
             if a["labels"].get("alertname") == "NodeStraggler"]
    print(f"NodeStraggler: {sorted(found) or 'none'} (planted: {nodes[0].instance})")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12500)
    parser.add_argument("--minutes", type=float, default=8.0)
    results.add_argument(parser)
    args = parser.parse_args()
    groups = global_groups(yaml.safe_load(VMALERT_RULES_FILE.read_text()))
    intervals = {g["name"]: parse_duration(g["interval"]) for g in groups["groups"]}
    nodes = fleet(args.nodes)
    sizes = sorted(Counter(n.job_id for n in nodes if n.job_id).values(), reverse=True)
    print(f"{len(nodes)} nodes x 8 GPUs: {len(sizes)} jobs of {sizes[:3]}...{sizes[-1:]} nodes, "
          f"{sum(not n.job_id and n.busy for n in nodes)} busy "
          f"without one, {sum(not n.busy for n in nodes)} idle; straggler {nodes[0].instance} (job {nodes[0].job_id})")
    print("global rules: " + "; ".join(f"{g['name']} every {g['interval']}: {len(g['rules'])}, "
                                       f"{g['concurrency']} at once" for g in groups["groups"]))
    with tempfile.TemporaryDirectory() as tmp:
        measured = evaluate(Path(tmp), groups, nodes, args.minutes)
    table = print_figures(measured, intervals, nodes)
    found = sorted(a["labels"].get("instance") for a in measured["alerts"]
                   if a["labels"].get("alertname") == "NodeStraggler")
    results.record("global_tier_bench", {
        "nodes": len(nodes), "series written": measured["written"],
        "rules alone, summed (s)": sum(t for t, _, _ in measured["slowest"]),
        "NodeStraggler on": " ".join(found) or "none", "planted": nodes[0].instance,
        **{f"{name} cores": cores for name, cores in measured["cpu"].items()},
        **{f"{name} peak RSS (MiB)": mib for name, mib in measured["rss"].items()}},
        {"rule groups": table}, path=args.results)


if __name__ == "__main__":
    main()
