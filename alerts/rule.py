"""The shape of one rule, shared by every group module."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config

# How a GPU is named in descriptions: index, UUID (what nvidia-smi and RMA forms use) and node.
GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
PORT = "{{ $labels.device }} port {{ $labels.port }} of {{ $labels.instance }}"
# The interval of every group that judges five minutes or more of data (and of what those groups read):
# evaluating a 5-minute rate or a 10-minute `for` every 15 s finds nothing sooner that matters, and at a
# thousand nodes it costs four times the CPU. Groups without an interval run at the scrape interval.
TREND_INTERVAL = "1m"
# How long after its inhibiting alert last fired an alert is not held (`alert`'s `inhibited_by`): a few evaluations
# of any group, so that neither group's order nor an engine's lag between them lets the hold begin.
INHIBITION_LOOKBACK = "5m"


def alert(config: Config, name: str, expr: str, severity: str, summary: str, description: str,
          for_: str | None = None, held: bool = True, held_by: tuple[str, ...] = (),
          at_stake: bool | None = None, gpu: bool = False,
          inhibited_by: tuple[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """An alerting rule with the annotations every gpufleet alert carries; `for_` goes through the time scale.

    Every alert but the exporter's own reads a node's series, which go stale the moment gpufleet stops seeing
    the node: the alert would resolve and the pager would say so, though nothing was repaired. `held` keeps a
    firing alert firing while its node is dark (`_held`) and says so in its description, where `$value`
    no longer means anything. `keep_firing_for` would hold it for a fixed time instead: too short for a host
    down two hours, and it would delay every real resolution as long. `held_by` names the scrape jobs whose
    series the alert needs (gpufleet's by default): beside node_exporter, a port alert that reads only
    node_exporter's series must resolve when node_exporter sees the port back, whether gpufleet's exporter
    answers or not. A `gpu` alert reads the GPU collector's series, which also stop while the node's driver
    does not answer.

    `at_stake` adds the jobs on the alert's node or GPU (`alerts.stake`); by default every page about a node's
    series has it.

    `inhibited_by` names the alert that inhibits this one at Alertmanager, and the labels the inhibition matches
    on. An instance that alert covered is not held: its incident is the other alert's, which is not held itself
    and resolves as its nodes go dark, and a held instance would then outlive the inhibition and page on its
    own for a fault nobody can see. A fault still there when the node is seen again fires afresh.
    """
    from gpufleet.alerts import stake  # It reads recording's series, whose module builds rules with this one.

    up = config.up(*held_by)
    excluded = ""
    if inhibited_by:
        source, labels = inhibited_by
        excluded = (f'on ({config.by(*labels)}) max_over_time(ALERTS{{alertname="{source}",alertstate="firing"}}'
                    f"[{config.d(INHIBITION_LOOKBACK)}])")
    rule: dict[str, Any] = {"alert": name, "expr": _held(config, name, expr, up, gpu, excluded) if held else expr}
    if for_:
        rule["for"] = config.d(for_)
    rule["labels"] = {"severity": severity}
    if held:
        description = (f"{{{{ with {_dark_query(config, up, gpu)} | query }}}}{summary} Held firing: gpufleet "
                       "cannot see {{ $labels.instance }} now (its exporter is not scraped"
                       f"{', or its GPU driver does not answer' if gpu else ''}), so the fault cannot be seen to "
                       f"end.{{{{ else }}}}{description}{{{{ end }}}}")
    rule["annotations"] = {"summary": summary, "description": description, "runbook_url": config.runbook(name)}
    if at_stake if at_stake is not None else severity == "critical" and held:
        rule["annotations"]["jobs_at_stake"] = stake.at_stake(config, TREND_INTERVAL)
    return rule


def _dark(config: Config, up: str, gpu: bool, matchers: str = "") -> str:
    """The nodes gpufleet cannot see now, among those `matchers` pick: a scrape that fails (`up` 0), a node
    expected (NODES_SEEN) that has no `up` at all (a lost scrape shard, a target dropped by discovery; Prometheus
    ends its series at once), one whose `up` is only its last value from a scraper that died (NODES_STALE: no
    staleness marker in VictoriaMetrics, whose lookback keeps each series until it has passed since that series'
    own last sample, and a dying vmagent's last samples may be of two scrapes), and for a `gpu` alert a GPU driver
    that does not answer (`gpufleet_gpu_driver_up` 0, also before the first collection after a restart).

    A few sparse results of instant selectors, read by every held alert at every evaluation: asking instead which
    nodes are fresh reads every node's `up` over a window, at every evaluation of every held alert."""
    from gpufleet.alerts.recording import NODES_SEEN, NODES_STALE

    node = config.by("instance")
    dark = [f"{with_matchers(up, matchers)} == 0", f"({with_matchers(NODES_SEEN, matchers)} unless on ({node}) {up})",
            with_matchers(NODES_STALE, matchers)]
    if gpu:
        dark.append(f"{with_matchers(config.metric('gpufleet_gpu_driver_up'), matchers)} == 0")
    return " or ".join(dark)


def dark_nodes(config: Config, matchers: str = "") -> str:
    """The nodes gpufleet cannot see now (`_dark`, of its own exporter's scrape), among those `matchers` pick: for
    an alert about many nodes, which must not take their going dark for their recovery."""
    return _dark(config, config.up(), False, matchers)


def held_while(config: Config, name: str, expr: str, condition: str, excluded: str = "") -> str:
    """`expr`, or the alert's own firing instances on the nodes `condition` picks, less those `excluded` matches
    (an `unless` operand): what keeps a firing alert firing once `expr` no longer says so. ALERTS carries the
    alert's labels and `alertstate`, dropped here so that the labels match the alert's again.

    `max without ()` changes nothing in Prometheus, but in VictoriaMetrics a comparison leaves the series it
    filtered out as gaps until the end of the query, and `or` fills gaps from its right side: while a node's
    last samples are still in the lookback, every GPU of a node whose exporter stopped took on each alert
    held for any one of them (the end-to-end test's exporter restart). An aggregation drops the gaps."""
    node = config.by("instance")
    firing = f'label_replace(ALERTS{{alertname="{name}",alertstate="firing"}}, "alertstate", "", "", "")'
    if excluded:
        firing = f"({firing} unless {excluded})"
    return f"max without () ({expr}) or on ({node}) ({firing} and on ({node}) ({condition}))"


def _held(config: Config, name: str, expr: str, up: str, gpu: bool, excluded: str = "") -> str:
    """`expr`, held on nodes gpufleet cannot see now (`_dark`): an exporter down or restarting, a target gone from
    the scrape, a driver that hangs. A node no longer expected (forgotten by NODES_SEEN) is not dark, and its
    alerts resolve."""
    return held_while(config, name, expr, _dark(config, up, gpu), excluded)


def _dark_query(config: Config, up: str, gpu: bool) -> str:
    """A Go-template `printf` of the query that finds the alert's node dark (`_dark`), for `query`. Only a node
    seen dark: one a test or a new rule engine knows nothing of is described as usual."""
    dark = _dark(config, up, gpu, f'{config.cluster_label}="%s",instance="%s"')
    return printf(dark, *(f"$labels.{config.cluster_label}", "$labels.instance") * (dark.count("%s") // 2))


def with_matchers(selector: str, matchers: str) -> str:
    """`name{a="b"}` with `matchers` added: `name{a="b",c="d"}`."""
    if not matchers:
        return selector
    if selector.endswith("}"):
        return f"{selector[:-1]},{matchers}}}"
    return f"{selector}{{{matchers}}}"


def printf(query: str, *arguments: str) -> str:
    """A Go-template `printf` that fills `query`'s `%s` with `arguments` (label references), for `query`."""
    return " ".join(("printf", '"' + query.replace('"', '\\"') + '"', *arguments))


def matcher(codes: tuple[int, ...], outside: bool = False) -> str:
    """A PromQL regex matcher for the `xid` label: one of `codes`, or with `outside` none of them."""
    return f'xid{"!~" if outside else "=~"}"{"|".join(str(code) for code in codes)}"'


def record(name: str, expr: str, **labels: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule
