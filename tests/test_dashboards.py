"""The generated dashboards: committed JSON up to date, valid Grafana models, every query answered by Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import yaml

from gpufleet.dashboards.cli import OUTPUT, rendered
from gpufleet.devtools.grafana import expand, has_data, ours, targets
from gpufleet.devtools.net import http
from gpufleet.devtools.paths import FIXTURES
from gpufleet.devtools.programs import prometheus, prometheus_config, simulator
from gpufleet.devtools.prom import query

from layouts import SIXTEEN_NODES, write

# NVIDIA's own dashboard for dcgm-exporter (its source in the folder's README), read through the compatibility layer.
DCGM_DASHBOARD = FIXTURES / "dcgm-exporter"

# Grafana's own variables, and the data-link ones (`${__data.fields.x}`, `${__value.raw}`).
BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__all", "__url_time_range", "__data",
            "__value"}


def models() -> list[dict]:
    return [json.loads(text) for text in rendered().values()]


def rendered_targets() -> list[tuple[str, str, str]]:
    return [(model["uid"], panel["title"], t["expr"]) for model in models() for panel in model["panels"]
            for t in panel["targets"]]


def test_the_committed_json_is_what_the_code_generates():
    assert {p.name: p.read_text(encoding="utf-8") for p in OUTPUT.glob("*.json")} == rendered(), \
        "run `gpufleet dashboards build` and commit the result"


@pytest.mark.e2e
def test_the_check_notices_a_stale_file(tmp_path):
    for name, text in rendered().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "gpufleet-fleet.json").write_text("{}\n")
    check = subprocess.run([sys.executable, "-m", "gpufleet", "dashboards", "build", "--check", f"--output={tmp_path}"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "gpufleet-fleet.json" in check.stderr


@pytest.mark.parametrize("model", models(), ids=lambda m: m["uid"])
def test_each_dashboard_is_a_valid_grafana_model(model):
    panels = model["panels"]
    assert model["uid"].startswith("gpufleet-") and model["title"].startswith("gpufleet / ")
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']} has no unit"
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name, variable in variables.items():
        if (model["uid"], name) == ("gpufleet-node", "instance"):  # One node: its per-GPU panels stay cheap.
            assert not variable["multi"] and not variable["includeAll"], name
        elif name != "datasource":
            assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*", name
    text = json.dumps(panels) + json.dumps(list(model["templating"]["list"]))
    used = set(re.findall(r"\$\{?(\w+)", text))
    assert used - BUILTINS <= set(variables), f"undefined variables: {used - BUILTINS - set(variables)}"
    uids = {m["uid"] for m in models()}
    for link in model["links"]:
        assert link["includeVars"] and link["keepTime"]
        assert link["url"].removeprefix("/d/") in uids, link
    data_links = re.findall(r'"url": "/d/([\w-]+)\?', json.dumps(panels))
    assert set(data_links) <= uids, f"data links to missing dashboards: {set(data_links) - uids}"


def test_rate_queries_use_the_rate_interval():
    for uid, title, expr in rendered_targets():
        for window in re.findall(r"(?:rate|increase)\([^\[]*\[([^\]]+)\]", expr):
            assert window in {"$__rate_interval", "$__range", "24h"}, (uid, title, expr)


# Faults that fill the panels a healthy fleet leaves empty: XIDs of each class, a lost GPU, a saturated
# link, ports down, slow, flapping or erroring, a straggler with a cause, a new ECC error,
# a remapped row, PCIe replays, NVLink CRC errors, an NVSwitch's SXid and storage timeouts. The layout
# (layouts.SIXTEEN_NODES) puts a Kubernetes job on nodes 4, 9, 12 and 16, and leaves nodes 5 and 7 idle.
FAULTS = [
    {"kind": "xid", "node": "gpu-node-0001", "gpu": 0, "xid": 79},
    {"kind": "xid", "node": "gpu-node-0001", "gpu": 1, "xid": 94},
    {"kind": "xid", "node": "gpu-node-0002", "gpu": 0, "xid": 13},
    {"kind": "gpu_lost", "node": "gpu-node-0003", "gpu": 2, "start": "10s"},  # Seen first, then lost.
    {"kind": "thermal_slowdown", "node": "gpu-node-0006", "gpu": 1},
    {"kind": "nic_saturation", "node": "gpu-node-0011", "port": "mlx5_1/1", "direction": "tx"},
    {"kind": "straggler", "node": "gpu-node-0004"},
    {"kind": "thermal_slowdown", "node": "gpu-node-0004", "gpu": 0},  # A cause for the straggler.
    {"kind": "ib_link_down", "node": "gpu-node-0009", "port": "mlx5_4/1"},
    {"kind": "ib_link_flap", "node": "gpu-node-0012", "port": "mlx5_5/1"},
    {"kind": "ib_rate_degraded", "node": "gpu-node-0016", "port": "mlx5_6/1"},
    {"kind": "symbol_errors", "node": "gpu-node-0014", "port": "mlx5_3/1"},
    {"kind": "ecc_dbe", "node": "gpu-node-0008", "gpu": 3, "start": "20s"},
    {"kind": "row_remap_pending", "node": "gpu-node-0008", "gpu": 4},
    {"kind": "pcie_replay_storm", "node": "gpu-node-0010", "gpu": 2},
    {"kind": "nvlink_crc", "node": "gpu-node-0013", "gpu": 1, "link": 4},
    {"kind": "sxid_fatal", "node": "gpu-node-0005"},
    {"kind": "kernel_events", "node": "gpu-node-0011", "event": "storage_timeout", "rate": 0.5},
]


# A site that names its clusters `site` and scrapes gpufleet as job `gpu-nodes`: the rules and dashboards are
# built for it with --config, so a `cluster` or `job="gpufleet"` left written into them shows as missing data.
SITE = {"cluster_label": "site", "selector": 'job="gpu-nodes"', "exporter_job": "gpu-nodes"}


@pytest.mark.slow
@pytest.mark.e2e
def test_every_query_returns_data_with_the_sites_own_cluster_label_and_selector(tmp_path):
    """Ours, and NVIDIA's dcgm-exporter dashboard through the compatibility layer."""
    scenario = tmp_path / "scenario.yml"
    scenario.write_text(yaml.safe_dump({"faults": FAULTS}))
    site = tmp_path / "site.yml"
    site.write_text(yaml.safe_dump(SITE))
    rules, dashboards = tmp_path / "rules", tmp_path / "dashboards"
    rules.mkdir()
    # Time scale 8: recorded series and ALERTS in minutes, not hours.
    for command in (["alerts", "build", f"--config={site}", "--time-scale=8", f"--output={rules / 'core.yml'}"],
                    ["alerts", "build", f"--config={site}", "--time-scale=8", "--layer=dcgm",
                     f"--output={rules / 'dcgm.yml'}"],
                    ["dashboards", "build", f"--config={site}", f"--output={dashboards}"]):
        subprocess.run([sys.executable, "-m", "gpufleet", *command], check=True, timeout=60)
    layout = write(tmp_path / "layout.yml", SIXTEEN_NODES)
    file_sd = tmp_path / "targets.json"
    with simulator(file_sd, "--nodes=16", "--seed=0", f"--layout={layout}", "--cluster=dash",
                   "--collect-interval=2s", f"--scenario={scenario}"):
        config = prometheus_config(tmp_path / "prometheus.yml", file_sd, "2s", rules / "*.yml", job="gpu-nodes",
                                   cluster_label="site")
        with prometheus(config, tmp_path / "data") as prom:
            url = prom.url
            pending = set(ours(targets(dashboards))) | set(targets(DCGM_DASHBOARD))
            # The panels can fill before the planted straggler's `for` has run out: wait for both.
            planted = 'ALERTS{alertname="NodeStraggler", alertstate="firing", instance="gpu-node-0004"}'
            deadline = time.monotonic() + 240
            while (pending or not query(url, planted)) and time.monotonic() < deadline:
                pending = {t for t in pending if not has_data(url, expand(t.expr), t.instant)}
                time.sleep(2)
            capacity = {t.title: float(query(url, expand(t.expr))[0]["value"][1])
                        for t in targets(dashboards) if t.uid == "gpufleet-capacity" and t.title in STATS}
            groups = json.loads(http("GET", f"{url}/api/v1/rules")[1])["data"]["groups"]
            straggler = query(url, 'ALERTS{alertname="NodeStraggler", alertstate="firing", site="dash"}')
            # The Watchdog, of the pipeline rather than of a cluster, carries none.
            without_site = query(url, '{__name__=~".+:.+", site=""} or ALERTS{site="", alertname!="Watchdog"}')
            dcgm = compatibility(url)
    assert not pending, "queries without data:\n" + "\n".join(
        f"{t.uid} / {t.title}: {t.expr}" for t in sorted(pending, key=lambda t: (t.uid, t.title, t.expr)))
    assert capacity == STATS
    assert [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"] == []
    # The planted straggler, and perhaps node 6, whose one GPU at 60 % of its clock holds the node's mean about 5 %
    # below its job's median: a straggler too, once its slowdown fills the signal window. No other node.
    stragglers = {r["metric"]["instance"] for r in straggler}
    assert "gpu-node-0004" in stragglers and stragglers <= {"gpu-node-0004", "gpu-node-0006"}, stragglers
    # Every recorded series and alert kept the site's cluster label.
    assert without_site == [], [r["metric"] for r in without_site]
    assert dcgm == DCGM, dcgm


def compatibility(url: str) -> dict[str, object]:
    """What the dcgm-exporter layer says of a few GPUs, beside gpufleet's own series converted by hand."""
    def one(expr: str) -> dict:
        [result] = query(url, expr)
        return {**result["metric"], "value": float(result["value"][1])}

    clock = one('DCGM_FI_DEV_MEM_CLOCK{instance="gpu-node-0001", gpu="0"}')
    ours = one('gpufleet_gpu_clock_hertz{instance="gpu-node-0001", gpu="0", clock="memory"}')
    info = one('gpufleet_gpu_info{instance="gpu-node-0001", gpu="0"}')
    used = one('DCGM_FI_DEV_FB_USED{instance="gpu-node-0002", gpu="3"} - on (instance, gpu) '
               'gpufleet_gpu_memory_used_bytes{instance="gpu-node-0002", gpu="3"} / 1048576')
    return {
        "MHz": clock["value"] == ours["value"] / 1e6,
        "labels": {k: clock[k] for k in ("UUID", "modelName", "device", "DCGM_FI_DRIVER_VERSION", "Hostname")} == {
            "UUID": info["uuid"], "modelName": info["name"], "device": "nvidia0",
            "DCGM_FI_DRIVER_VERSION": info["driver_version"], "Hostname": "gpu-node-0001"},
        "MiB": abs(used["value"]) < 1,  # The same scrape's value, unless a scrape fell between rule and query.
        "hpc_job": clock.get("hpc_job"),
        "xid": {(r["metric"]["instance"], r["metric"]["gpu"]): float(r["value"][1])
                for r in query(url, "DCGM_FI_DEV_XID_ERRORS != 0")},
        "GPUs": int(one("count(DCGM_FI_DEV_GPU_TEMP)")["value"]),
    }


# Node 1 runs Slurm job 944279. The scenario's XIDs: 79 and 94 on node 1 and 13 on node 2, and those its faults
# raise, 79 of the GPU lost on node 3 and 48 of the double-bit error on node 8. 127 GPUs answer.
DCGM = {"MHz": True, "labels": True, "MiB": True, "hpc_job": "944279",
        "xid": {("gpu-node-0001", "0"): 79.0, ("gpu-node-0001", "1"): 94.0, ("gpu-node-0002", "0"): 13.0,
                ("gpu-node-0003", "2"): 79.0, ("gpu-node-0008", "3"): 48.0},
        "GPUs": 127}


# What the capacity stats read for that fleet: 16 nodes of 8 GPUs, nodes 5 and 7 idle, and the lost GPU
# neither allocated nor idle.
STATS = {"GPUs installed": 128, "GPUs healthy": 127, "GPUs allocated": 111, "GPUs idle": 16,
         "Allocated share": 111 / 128}
