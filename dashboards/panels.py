"""Panel helpers: units, legends, thresholds, tooltips and the template variables, applied once.

Every panel reads the `datasource` template variable, so file provisioning works without
`__inputs`; every query filters by the variables it can, with `=~` so that "All" (`.*`) also
matches series without the label. What a query selects and groups by follows the configuration
the rules are built from (`alerts.config.Config`): its selector, and its cluster label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafanalib import core

from gpufleet.alerts.config import Config

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24
PORT_LEGEND = "{{instance}} {{device}}/{{port}}"


class Scope:
    """The matchers dashboards start their queries from, for one configuration; panels add their own after.

    The exporters' series are selected with the configuration's selector and the dashboard's variables
    (`cluster`, `node`, `gpu`); recorded series and ALERTS, which do not carry the selector's labels,
    with the variables alone (`recorded`, `recorded_node`).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.label = config.cluster_label
        self.legend = f"{{{{{self.label}}}}}"  # `{{cluster}}`, a legend that names the series' cluster.
        self.recorded = f'{self.label}=~"$cluster"'
        self.recorded_node = f'{self.recorded}, instance=~"$instance"'
        self.cluster = ", ".join(part for part in (config.selector, self.recorded) if part)
        self.node = f'{self.cluster}, instance=~"$instance"'
        self.gpu = f'{self.node}, gpu=~"$gpu"'

    def by(self, *labels: str) -> str:
        return self.config.by(*labels)

    def series(self, metric: str, matchers: str) -> str:
        """`metric{matchers}`, `matchers` being this scope's `cluster`, `node` or `gpu`, named as the configuration
        names it (`Config.metric`): node_exporter's series of the same reading, under its job, where the site keeps
        node_exporter."""
        mine = self.config.selector
        if not matchers.startswith(mine):
            raise ValueError(f"{matchers} is not one of this scope's matchers")
        return self.config.metric(metric, matchers[len(mine):].lstrip(", "))

    def rate(self, metric: str, matchers: str) -> str:
        """A counter's per-second rate over Grafana's `$__rate_interval`, which follows the zoom."""
        return f"rate({self.series(metric, matchers)}[$__rate_interval])"

    def templating(self, *names: str, single: Sequence[str] = ()) -> core.Templating:
        """The datasource variable, then the named query variables: multi-select with All, except those in
        `single`, which pick one value. A per-GPU panel at All draws every GPU of the fleet (8,000 lines at
        1,000 nodes) and costs Prometheus seconds to compute; a dashboard about one node asks for one."""
        selector = f"{{{self.config.selector}}}" if self.config.selector else ""
        queries = {
            "cluster": ("Cluster", f"label_values(gpufleet_gpu_devices{selector}, {self.label})"),
            "instance": ("Node", f"label_values(gpufleet_gpu_devices{{{self.cluster}}}, instance)"),
            "gpu": ("GPU", f"label_values(gpufleet_gpu_up{{{self.node}}}, gpu)"),
            "job_id": ("Job", f"label_values(gpufleet_gpu_job_info{{{self.cluster}}}, job_id)"),
        }
        variables = [core.Template(name="datasource", label="Data source", query="prometheus", type="datasource",
                                   default="gpufleet-prometheus")]
        for name in names:
            label, query = queries[name]
            if name in single:
                variables.append(core.Template(name=name, label=label, query=query, dataSource=DATASOURCE,
                                               includeAll=False, multi=False, refresh=2, sort=3))
            else:
                variables.append(core.Template(name=name, label=label, query=query, dataSource=DATASOURCE,
                                               includeAll=True, multi=True, allValue=".*", refresh=2, sort=3,
                                               default="$__all"))
        return core.Templating(list=variables)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> core.Target:
    return core.Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DATASOURCE,
                       format="table" if table else "time_series")


def _targets(queries: Sequence[tuple[str, str]], instant: bool = False, table: bool = False) -> list[core.Target]:
    return [target(expr, legend, chr(ord("A") + i), instant=instant, table=table)
            for i, (expr, legend) in enumerate(queries)]


@dataclass
class Sized:
    """A panel and its size in grid units; `layout` gives it a place."""

    panel: core.Panel
    width: int
    height: int


def timeseries(title: str, queries: Sequence[tuple[str, str]], unit: str, width: int = 12, height: int = 8,
               description: str = "", stacked: bool = False, max_value: int | None = None,
               min_step: str | None = None) -> Sized:
    """`min_step`, the panel's minimum interval, keeps a graph over every GPU's raw series from being asked at
    every scrape of a short range: Grafana's step is the longer of it and the range over the panel's maximum
    data points."""
    panel = core.TimeSeries(
        title=title, description=description, dataSource=DATASOURCE, targets=_targets(queries), unit=unit,
        legendDisplayMode="table", legendPlacement="right" if width >= 16 else "bottom", legendCalcs=["mean", "max"],
        tooltipMode="multi", tooltipSort="desc", stacking={"mode": "normal" if stacked else "none"},
        fillOpacity=10, lineWidth=1, spanNulls=False, valueMin=0, valueMax=max_value, interval=min_step)
    return Sized(panel, width, height)


def stat(title: str, expr: str, unit: str = "none", width: int = 4, height: int = 4, description: str = "",
         thresholds: Sequence[tuple[str, float | None]] = (("green", None),)) -> Sized:
    panel = core.Stat(
        title=title, description=description, dataSource=DATASOURCE, targets=[target(expr, instant=True)],
        format=unit, reduceCalc="lastNotNull", graphMode="none", colorMode="background",
        thresholdType="absolute",
        thresholds=[core.Threshold(color, i, value=float(value) if value is not None else 0.0)
                    for i, (color, value) in enumerate(thresholds)])
    return Sized(panel, width, height)


def _value_columns(queries: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Grafana names the value column of a table query "Value", or "Value #A" once there are several."""
    if len(queries) == 1:
        return {"Value": queries[0][1]} if queries[0][1] else {}
    return {f"Value #{chr(ord('A') + i)}": legend for i, (_, legend) in enumerate(queries) if legend}


def table(title: str, queries: Sequence[tuple[str, str]], unit: str = "none", width: int = 24, height: int = 8,
          description: str = "", node_link: Scope | None = None) -> Sized:
    """An instant-query table, one row per label set with a column per query, sortable by any column.

    With `node_link`, a click on the instance column opens that node's detail dashboard, keeping
    the time range and the row's cluster: the on-call engineer goes from "which" to "why" in one click.
    """
    overrides = []
    if node_link is not None:
        url = ("/d/gpufleet-node?${__url_time_range}&var-datasource=${datasource}"
               f"&var-cluster=${{__data.fields.{node_link.label}}}&var-instance=${{__value.raw}}")
        overrides.append({"matcher": {"id": "byName", "options": "instance"},
                          "properties": [{"id": "links", "value": [{"title": "Node detail", "url": url}]}]})
    panel = core.Table(
        title=title, description=description, dataSource=DATASOURCE,
        targets=_targets(queries, instant=True, table=True), unit=unit, filterable=True, overrides=overrides,
        transformations=[{"id": "merge", "options": {}},
                         {"id": "organize", "options": {
                             "excludeByName": {"Time": True, "__name__": True, "job": True},
                             "renameByName": _value_columns(queries)}}])
    return Sized(panel, width, height)


def heatmap(title: str, expr: str, legend: str, unit: str, width: int = 24, height: int = 9,
            description: str = "", buckets: bool = False) -> Sized:
    """One row per series, coloured by value: Grafana's heatmap with no bucketing of its own.

    Each row is a node (a value in `unit`, from 0 to 1), or with `buckets` a bucket: the series count what
    falls in it, the legend is its lower bound in `unit`, and the colours follow the counts. Grafana sorts
    numeric legends, so the rows stand in order even when a bucket is empty for the whole range.
    """
    color = {"mode": "scheme", "scheme": "Turbo"} | ({} if buckets else {"min": 0, "max": 1})
    options = {"calculate": False, "yAxis": {"unit": unit}, "color": color,
               "cellValues": {"unit": "short" if buckets else unit}, "tooltip": {"show": True, "yHistogram": False}}
    if buckets:
        options["rowsFrame"] = {"layout": "ge"}
    panel = core.Heatmap(title=title, description=description, dataSource=DATASOURCE,
                         targets=[target(expr, legend)],
                         extraJson={"type": "heatmap", "options": options,
                                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}})
    return Sized(panel, width, height)


def layout(rows: Sequence[Sequence[Sized]]) -> list[core.Panel]:
    """Place rows of panels top to bottom, left to right, and number them; a row must fit 24 columns."""
    panels, y, next_id = [], 0, 1
    for row in rows:
        x = 0
        if sum(item.width for item in row) > GRID_COLUMNS:
            raise ValueError(f"a row is wider than {GRID_COLUMNS} columns: {[i.panel.title for i in row]}")
        for item in row:
            item.panel.gridPos = core.GridPos(h=item.height, w=item.width, x=x, y=y)
            item.panel.id = next_id
            panels.append(item.panel)
            x += item.width
            next_id += 1
        y += max(item.height for item in row)
    return panels


def links(*uids_titles: tuple[str, str]) -> list[core.DashboardLink]:
    """Links to other gpufleet dashboards that carry the time range and the selected variables."""
    return [core.DashboardLink(title=title, uri=f"/d/{uid}", type="link", keepTime=True, includeVars=True,
                               icon="dashboard", tooltip="", targetBlank=False, tags=[], asDropdown=False)
            for uid, title in uids_titles]


def dashboard(scope: Scope, uid: str, title: str, description: str, variables: Sequence[str],
              rows: Sequence[Sequence[Sized]], related: Sequence[tuple[str, str]] = (),
              single: Sequence[str] = ()) -> core.Dashboard:
    return core.Dashboard(
        uid=uid, title=title, description=description, tags=["gpufleet"], timezone="browser",
        refresh="1m", time=core.Time("now-6h", "now"), graphTooltip=core.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        templating=scope.templating(*variables, single=single), panels=layout(rows), links=links(*related),
        editable=False)
