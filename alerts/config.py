"""The one configuration behind the rules, the dashboards and the reports, as a monitoring mixin keeps one.

Selectors, the name of the cluster label, thresholds, windows, `for` durations and runbook links
live here; `gpufleet alerts build --config FILE` and `gpufleet dashboards build --config FILE` (and
`gpufleet report capacity --config FILE`) read a YAML file of overrides, checked key by key:

    cluster_label: site
    selector: 'job="gpu-nodes"'
    exporter_job: gpu-nodes
    saturation_warning: 0.85
    straggler_for: 15m

The committed rule file and dashboards are built from the defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import yaml

from gpufleet import duration
from gpufleet.alerts import node_exporter

Duration: TypeAlias = str  # In gpufleet's duration grammar, as PromQL writes it: `15m`, `1h30m`.
AlertOverrides: TypeAlias = dict[str, dict[str, Any]]  # Alert name -> severity, disabled, labels.
KubernetesValues: TypeAlias = dict[str, Any]  # deploy/site.py's keys.
SEVERITIES = ("critical", "warning", "info")
_OVERRIDES = ("severity", "disabled", "labels")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Config:
    # Added to every selector of the exporters' series, for example 'job="gpufleet"'; empty matches every
    # target. Recorded series do not carry the labels it names, so it is not added to theirs.
    selector: str = ""
    # The target label that names a cluster (as the scrape configuration sets it): every aggregation keeps
    # it, so no figure mixes clusters.
    cluster_label: str = "cluster"
    # The scrape job of the exporters: `up` of other jobs (Prometheus itself, Alertmanager) is not ours.
    exporter_job: str = "gpufleet"
    # The scrape job of blackbox_exporter's probes of the nodes themselves (ICMP in production), whose `instance` names
    # each node as the exporters' does (docs/deployment/probes.md): a node that answers no probe is down or cut off
    # (NodeUnreachable), one that answers while its exporter does not has lost its exporter (NodeExporterDown).
    # Empty, or no probes: every node that cannot be scraped is NodeExporterDown.
    probe_job: str = "gpufleet-probe"
    # The scrape job of Alertmanager's own metrics, whose failed notifications are alerted on.
    alertmanager_job: str = "alertmanager"
    # The scrape job of `gpufleet remediate`, whose stopped drains and failed checks are alerted on.
    remediate_job: str = "gpufleet-remediate"
    runbook_url: str = "https://github.com/gpufleet/gpufleet/blob/main/docs/runbooks.md#{anchor}"
    # The scrape job of node_exporter on the same nodes, for a site that keeps it: the network, InfiniBand,
    # hwmon and thermal readings are then node_exporter's series of this job (alerts/node_exporter.py), whose
    # `instance` must name each node as the exporters' does. Empty: gpufleet's own collectors.
    node_exporter_job: str = ""
    # The scrape job of Prometheus' ipmi_exporter on the same nodes, whose BMC sensors (power supplies, fans, inlet
    # temperature) the rules read (alerts/bmc.py), with each node's `instance` as the exporters' names it
    # (docs/exporter/ipmi-exporter.md). Empty: no BMC rules.
    ipmi_exporter_job: str = "ipmi"
    # The BMC temperature sensors that measure the air a node takes in, by their name (vendors say Inlet, Ambient).
    inlet_sensor: str = "(?i).*(inlet|ambient).*"
    # Every window and `for` duration is divided by this. Only the end-to-end test sets it, so that
    # alerts meant to wait ten minutes wait seconds; the committed file is generated at 1.
    time_scale: float = 1.0

    xid_window: Duration = "15m"  # How long an XID event keeps its alert firing.
    repeat_window: Duration = "1h"  # An application XID seen again within this window is a repeat.
    ecc_window: Duration = "15m"
    gpu_count_lookback: Duration = "1d"
    pcie_replays_per_minute: float = 8.0  # Above DCGM's recommended limit.
    # Correctable AER errors a minute on one link, at either end: the GPU's own replay limit, for every link.
    pcie_correctable_per_minute: float = 8.0
    nvlink_crc_per_second: float = 100.0  # DCGM's limit.
    slowdown_share: float = 0.1  # Share of samples with a hardware slowdown reason active.
    slowdown_window: Duration = "10m"
    thermal_margin_celsius: float = 2.0  # NVSentinel flags H100s below about 2 °C of margin.
    thermal_margin_gpus: int = 4  # This many GPUs of one node that close to slowdown is its cooling, and pages.
    retired_pages_critical: int = 60  # DCGM: 60+ retired pages is an RMA candidate on pre-Ampere GPUs.
    stale_seconds: int = 300  # A collector without a success for this long is stale.

    # Stragglers: a node is one when both tests agree, for `straggler_for`, in a job of enough nodes.
    # Each node's signal is the median of its one-minute means over this: each minute sees through the phases
    # of a few training steps, and the median through one slow minute.
    signal_window: Duration = "2m"
    # A minute in which one of a node's GPUs in a job read less than this at a scrape (idle through the whole
    # interval the exporter averages) is a pause, not a slow minute: one rank writing a checkpoint while the
    # others wait, a node that stalls. The better of its last two whole minutes of work stands in for it. A straggler's
    # GPUs work through every scrape; a node whose stalls outlast a scrape interval is hung, not slow.
    straggler_pause_utilization: float = 0.05
    # A stall too short to idle a whole scrape reads low in each minute whose scrapes it touches, two at most,
    # which the median leaves out; a node that stalls so again and again is slow, and fires once its median
    # minute has been low for this long.
    straggler_for: Duration = "2m"
    # A node below this share of its job's median node in every minute of the signal's window is slow, not
    # stalled: a stall too short to idle a scrape touches two minutes at most, a longer one is a pause. It fires
    # without waiting out `straggler_for`, as a fast burn rate needs a shorter window than a slow one: a 10 %
    # straggler is found a minute or two sooner, a 5 % one as before.
    straggler_relative_deep: float = 0.93
    straggler_min_nodes: int = 4
    # Score against the job's median node. A node that stretches a step by 5 % runs its SM clock about 7 %
    # slower (clock, thermal and power causes) or its GPUs about 5 % less busy (PCIe and host causes); healthy
    # nodes of one job sit within about 2 % of the median (the simulator's spread, from measured fleets).
    straggler_relative: float = 0.97
    # Nodes compared by GPU model (no job id) run different jobs, whose phases differ by more than 5 %: only
    # a large slowdown tells them apart (nvidia-resiliency-ext's default cut-off, there against the best rank).
    straggler_relative_model: float = 0.75
    straggler_zscore: float = -3.5  # Modified z-score from median and MAD (Iglewicz and Hoaglin).
    # The MAD is taken as at least this share of the median: in a job of identical nodes the MAD can be
    # tiny, and a z-score over it would turn a 1 % difference into an outlier. At this floor the z-score
    # needs a node 2.6 % below the median.
    straggler_mad_floor: float = 0.005
    busy_utilization: float = 0.5  # Nodes with no job are compared only while their GPUs are this busy.

    # Hung jobs (alerts/jobs.py): a GPU spins while NVML counts it busy and its SM and tensor activity (GPM) stay
    # below these; NCCL's polling kernel keeps a few SMs of a hundred or more active.
    job_hang_sm_active: float = 0.15
    job_hang_tensor_active: float = 0.05
    job_hang_spinning_share: float = 0.5  # At least this share of a job's GPUs spin, and none works.
    job_hang_min_gpus: int = 2  # One GPU that spins alone is more likely a polling service than a collective.
    # Held this long after a whole evaluation interval hung (alerts/jobs.py): paged within five minutes of the hang,
    # while PyTorch's NCCL watchdog (10 minutes by default) has yet to end the job. A site whose ranks wait in a
    # collective longer than that on purpose (a synchronous checkpoint written by one rank) raises it.
    job_hang_for: Duration = "2m"
    job_hang_lookback: Duration = "30m"  # How far back the page looks for the first node with a fault signal.

    # A node's record (alerts/history.py): this many repairs, stragglers and link flaps within the window make a
    # node to take out and inspect. The store must keep the window.
    repeat_faults: int = 3
    repeat_fault_window: Duration = "30d"

    # Drift (alerts/drift.py): how long a node may differ from its job or its model's fleet before a ticket, and the
    # share of its board's default power limit below which a GPU's limit counts as lowered.
    drift_for: Duration = "15m"
    power_limit_share: float = 0.99

    # Kernel log (alerts/kernel.py): this many messages of one event within the window is a ticket.
    kernel_events_repeated: int = 3
    kernel_events_window: Duration = "30m"
    sxid_repeated: int = 3  # Non-fatal SXids of one code on one switch within `sxid_window`: a ticket.
    sxid_window: Duration = "1h"
    # A shared file system's outage (alerts/storage.py): storage timeouts within `storage_outage_window` on at least
    # this share of a cluster's nodes, and this many, page once for the cluster and hold back the nodes' tickets.
    storage_outage_share: float = 0.05
    storage_outage_nodes: int = 3
    storage_outage_window: Duration = "5m"
    storage_outage_for: Duration = "2m"
    # Nodes of a cluster whose exporter cannot read the kernel log, above this share: one ticket.
    kernel_log_blind_share: float = 0.1

    # Network and fabric.
    saturation_warning: float = 0.8  # Share of link speed.
    saturation_critical: float = 0.95  # With a training job on the node.
    # Utilisation is averaged over this window before the thresholds apply: a rate over a snapshot
    # exporter's counters wobbles by the collection interval over the rate window (±5% at 15 s over
    # 5 m), enough to drop a port at 97% below 95% now and then, restarting `for`.
    saturation_window: Duration = "10m"
    saturation_for: Duration = "5m"
    # port_xmit_wait ticks per second. The tick differs by HCA, so tune this to your fabric; below it,
    # a port is still flagged when its node waits `xmit_wait_outlier` times more than its job's median.
    xmit_wait_per_second: float = 10e6
    xmit_wait_outlier: float = 4.0
    link_downed_window: Duration = "15m"
    link_flaps: int = 2  # More link-downs than this in the window is a flapping link.
    link_downed_for: Duration = "5m"  # A flap that goes down thrice within this pages before it tickets.
    symbol_errors_per_hour: int = 120  # NVSentinel.
    link_error_recoveries_per_minute: float = 5.0  # NVSentinel.
    receive_errors_per_second: float = 10.0  # NVSentinel.
    transmit_discards_per_second: float = 100.0  # NVSentinel.
    roce_out_of_buffer_per_second: float = 100.0
    roce_slow_restarts_per_second: float = 1.0
    ethernet_error_share: float = 0.01  # Errors per packet, as kube-prometheus.
    # A leaf switch down: at least this share of the nodes behind one leaf (the label `leaf_label`, from the
    # site's topology; see alerts/topology.py), and this many, have the same InfiniBand HCA down at once.
    leaf_label: str = "leaf"
    leaf_down_share: float = 0.5
    leaf_down_nodes: int = 2
    # A rack whose nodes go dark together (its power or its top-of-rack switch): at least this share of the
    # nodes of one rack (the label `rack_label`, from the site's topology), and this many, down at once are one
    # incident naming the rack. Most of the rack: two reboots at once in a rack of four are two nodes' own.
    rack_label: str = "rack"
    rack_down_share: float = 0.75
    rack_down_nodes: int = 2
    # A node that stopped being a scrape target stays expected this long: its held pages and NodesUnscraped stay
    # open meanwhile (a lost scrape shard, a target gone from discovery). Nodes retired on purpose sooner are
    # forgotten by deleting their `instance:gpufleet_up:last_seen` series (docs/runbooks.md#nodesunscraped).
    node_forget_after: Duration = "7d"

    # Planned work (alerts/maintenance.py). The scheduler's name of a node is this regex's first group of the
    # node's `instance` (the whole label, as PromQL's label_replace anchors it): the host before the port.
    scheduler_node_pattern: str = "([^:]+)(:[0-9]+)?"
    # A Slurm node drained or set down with a reason that matches this (the whole reason) is in maintenance, as a
    # node in a maintenance reservation or a cordoned Kubernetes node is. gpufleet's own drains ("gpufleet: ...")
    # and a health check's never match: a fault is not planned work.
    maintenance_reason: str = "(?i)(maint|maintenance|planned|upgrade|rma)([^a-z].*)?"
    # More than this share of a cluster's nodes in maintenance at once is a ticket: work that big is a decision.
    maintenance_share: float = 0.25
    # A node still in maintenance this long after the stated end of the last Slurm maintenance reservation that held
    # it is a ticket (NodeMaintenanceOverdue): the work ran late, or nobody returned the node.
    maintenance_overdue: Duration = "1h"
    # A GPU repair on a node whose GPUs had no work for the last 10 minutes is a ticket once the node is out of
    # service (drained or down in Slurm, cordoned); it pages (GpuRepairUrgent) if the node is still in service
    # this long after the repair was raised: time for `gpufleet remediate` or a person to drain it.
    drain_grace: Duration = "2m"

    # vmalert only: how many rules of a pager group (one that runs at the evaluation interval) it asks at once,
    # its group field `concurrency`, capped at the group's size: one after another, a group waits for each of
    # its round trips to the store (docs/deployment/scale.md). More than the store's
    # `-search.maxConcurrentRequests` only queues there.
    vmalert_concurrency: int = 4
    # vmalert only: the same for the groups that run every minute (`rule.TREND_INTERVAL`). Groups that run less
    # often ask one at a time, so that the capacity and reliability groups cannot take the store's query slots
    # from the pager.
    vmalert_trend_concurrency: int = 2

    # A site's own view of each alert, by name, without editing generated files: another `severity`
    # (critical pages, warning tickets, info reaches nobody), `disabled: true`, or more `labels` (a team, a
    # service) for its routing. For example:
    #     alerts:
    #       GpuNeedsReplacement: {severity: info, labels: {team: hardware}}
    #       NicInfinibandRateDegraded: {disabled: true}
    alerts: AlertOverrides = dataclasses.field(default_factory=dict)
    # The Kubernetes manifests' values (namespace, cluster name, image, selector labels): deploy/site.py.
    kubernetes: KubernetesValues = dataclasses.field(default_factory=dict)

    def by(self, *labels: str) -> str:
        """A grouping that keeps clusters apart: `cluster, instance` for `by("instance")`."""
        return ", ".join((self.cluster_label, *labels))

    def node(self, *labels: str) -> str:
        """The grouping of an aggregation that an alert about a node comes from: `by("instance")` and the node's
        place (leaf, rack), which the scrape puts on its series where the site has a topology. Every alert of a
        node then has the same group key at Alertmanager, and a rack or leaf alert can hold its nodes' back.
        Joins (`on`) match on `by("instance")` alone: not every series carries the place."""
        return self.by("instance", self.leaf_label, self.rack_label, *labels)

    def metric(self, name: str, *matchers: str) -> str:
        """`name{selector,matchers}`, leaving out what is empty; node_exporter's series where it has this one
        and the site keeps it."""
        if self.node_exporter_job and name in node_exporter.NAMES:
            return _series(node_exporter.NAMES[name], self.node_exporter_selector(), *matchers)
        return _series(name, self.selector, *matchers)

    def node_exporter_selector(self) -> str:
        return f'job="{self.node_exporter_job}"'

    def power_meter(self, *matchers: str) -> str:
        """Each node's own power meter, in watts. node_exporter names a hwmon chip by its device path (its
        `chip_names` series carries the driver's name), gpufleet by its driver's name."""
        chip = node_exporter.POWER_METER_CHIP
        if not self.node_exporter_job:
            return self.metric("gpufleet_hwmon_power_watts", *matchers, f'chip="{chip}"')
        # gpufleet reads a sensor's average where it has no instantaneous input, as a meter often has not.
        selector = self.node_exporter_selector()
        watts = (f"({_series('node_hwmon_power_watt', selector, *matchers)} or "
                 f"{_series('node_hwmon_power_average_watt', selector, *matchers)})")
        names = _series("node_hwmon_chip_names", selector, *matchers, f'chip_name="{chip}"')
        return f"{watts} * on ({self.by('instance', 'chip')}) group_left () {names}"

    def up(self, *jobs: str) -> str:
        """The exporters' `up` (of the scrape `jobs`; gpufleet's by default): 0 while Prometheus cannot scrape
        one, and its series are stale. Another job's is not narrowed by the selector, which picks gpufleet's."""
        if not jobs or jobs == (self.exporter_job,):
            return self.metric("up", f'job="{self.exporter_job}"')
        return _series("up", f'job="{jobs[0]}"' if len(jobs) == 1 else f'job=~"{"|".join(jobs)}"')

    def probe_failed(self) -> str:
        """Each node whose probe failed at its latest scrape."""
        return f'probe_success{{job="{self.probe_job}"}} == 0'

    def node_jobs(self) -> tuple[str, ...]:
        """The scrape job whose series the network and sensor rules read: node_exporter's beside it."""
        return (self.node_exporter_job or self.exporter_job,)

    def both_jobs(self) -> tuple[str, ...]:
        """gpufleet's job, and node_exporter's beside it: for a rule that reads series of both."""
        return (self.exporter_job, *((self.node_exporter_job,) if self.node_exporter_job else ()))

    def runbook(self, alert: str) -> str:
        return self.runbook_url.format(anchor=alert.lower())

    def d(self, window: str) -> str:
        """A window or `for` duration after the time scale; unchanged at scale 1, so the file reads naturally."""
        seconds = duration.parse(window)  # Refused here, not by Prometheus, when it is not a duration.
        if self.time_scale == 1:
            return window
        return duration.render(max(1, round(seconds / self.time_scale)))

    def scaled(self, time_scale: float) -> Config:
        return dataclasses.replace(self, time_scale=time_scale)


def _series(name: str, *matchers: str) -> str:
    inner = ",".join(part for part in matchers if part)
    return f"{name}{{{inner}}}" if inner else name


def load(path: str | Path) -> Config:
    """The defaults with a YAML file's overrides; every key is checked against the field it sets."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if document is None:
        return Config()
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    fields = {f.name: f for f in dataclasses.fields(Config) if f.name != "time_scale"}
    for key, value in document.items():
        if key not in fields:
            raise ConfigError(f"{path}: unknown key {key!r}; the keys are {', '.join(sorted(fields))}")
        _check(path, key, fields[key].type, value)
    return dataclasses.replace(Config(), **{key: _value(fields[key].type, value)  # type: ignore[arg-type]
                                            for key, value in document.items()})  # Each value checked above.


def _value(kind: object, value: object) -> object:
    """A checked value as its field holds it: a float from YAML's `1`, a duration as PromQL writes it."""
    if kind == "float" and isinstance(value, int):
        return float(value)
    if kind == "Duration" and isinstance(value, str | int | float):
        return duration.render(duration.parse(value))  # `90` (seconds) -> `1m30s`
    return value


def _check(path: str | Path, key: str, kind: object, value: object) -> None:
    if kind == "AlertOverrides":
        _check_overrides(path, value)
        return
    if kind == "KubernetesValues":
        from gpufleet.deploy import site  # Only a file that has the section pays for the import.

        try:
            site.check(value)
        except ValueError as err:
            raise ConfigError(f"{path}: kubernetes: {err}") from None
        return
    expected = {"str": str, "Duration": str | int | float, "float": int | float, "int": int}[str(kind)]
    if isinstance(value, bool) or not isinstance(value, expected):
        what = {"str": "text", "Duration": "a duration", "float": "a number", "int": "a whole number"}[str(kind)]
        raise ConfigError(f"{path}: {key} must be {what}, not {value!r}")
    if kind == "Duration":
        try:
            duration.parse(value)
        except duration.DurationError as err:
            raise ConfigError(f"{path}: {key}: {err}") from None
    if key in ("cluster_label", "leaf_label", "rack_label") and not _LABEL.fullmatch(str(value)):
        raise ConfigError(f"{path}: {key} {value!r} is not a Prometheus label name")
    if key in ("scheduler_node_pattern", "maintenance_reason"):
        try:
            re.compile(str(value))
        except re.error as err:
            raise ConfigError(f"{path}: {key} {value!r} is not a regular expression: {err}") from None
    if key == "maintenance_share" and isinstance(value, int | float) and not 0 < value <= 1:
        raise ConfigError(f"{path}: {key} must be a share above 0 and at most 1, not {value!r}")
    if key in ("vmalert_concurrency", "vmalert_trend_concurrency") and isinstance(value, int) and value < 1:
        raise ConfigError(f"{path}: {key} must be 1 or more, not {value!r}")


def _check_overrides(path: str | Path, value: object) -> None:
    """`alerts:` is alert name -> {severity, disabled, labels}; whether each name is an alert is checked when the
    rules are built (`rules.render`), which knows them."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: alerts must map alert names to their changes, not {value!r}")
    for name, change in value.items():
        if not isinstance(change, dict) or not change:
            raise ConfigError(f"{path}: alerts: {name}: expected some of {', '.join(_OVERRIDES)}, not {change!r}")
        for key, setting in change.items():
            if key not in _OVERRIDES:
                raise ConfigError(f"{path}: alerts: {name}: unknown key {key!r}; the keys are {', '.join(_OVERRIDES)}")
            if key == "severity" and setting not in SEVERITIES:
                raise ConfigError(f"{path}: alerts: {name}: severity must be one of {', '.join(SEVERITIES)}, "
                                  f"not {setting!r}")
            if key == "disabled" and not isinstance(setting, bool):
                raise ConfigError(f"{path}: alerts: {name}: disabled must be true or false, not {setting!r}")
            if key == "labels" and (not isinstance(setting, dict) or not all(
                    isinstance(k, str) and _LABEL.fullmatch(k) and k not in ("alertname", "severity")
                    and isinstance(v, str) for k, v in setting.items())):
                raise ConfigError(f"{path}: alerts: {name}: labels must map label names (not alertname or "
                                  f"severity) to text, not {setting!r}")


def add_argument(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`, read when the flags are parsed: a bad file is a usage error that names the key."""
    parser.add_argument("--config", type=_from_flag, default=Config(), metavar="FILE",
                        help="YAML file of settings that replace the defaults of gpufleet's rules and dashboards "
                             "(cluster_label, selector, thresholds, windows; see alerts/config.py)")


def _from_flag(path: str) -> Config:
    try:
        return load(path)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
