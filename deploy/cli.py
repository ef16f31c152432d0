"""`gpufleet deploy kubernetes`: write the Kubernetes manifests for a site's configuration (the committed ones, at
the defaults, in deploy/kubernetes/), or check that they are current."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gpufleet import checkout, extras
from gpufleet.alerts import config
from gpufleet.deploy import manifests
from gpufleet.deploy.site import Site, site

DELETE_SERVICE_MONITOR = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("deploy", help="write the Kubernetes manifests",
                                   description="Generate the install for a site from its configuration.")
    commands = parser.add_subparsers(dest="deploy_command", metavar="COMMAND", required=True)
    kubernetes = commands.add_parser(
        "kubernetes", help="the DaemonSet, monitors, PrometheusRule, AlertmanagerConfig and dashboard ConfigMaps",
        description="Write a kustomization (kubectl apply -k DIR) for kube-prometheus-stack: the site's values "
                    "come from the `kubernetes:` section of --config (deploy/site.py).")
    kubernetes.add_argument("--output", type=Path, metavar="DIR",
                            help="where to write (default: deploy/kubernetes/ of the checkout this runs in)")
    kubernetes.add_argument("--check", action="store_true",
                            help="write nothing; exit 1 if a file it would write is out of date")
    config.add_argument(kubernetes)
    kubernetes.set_defaults(handler=run)


class _Dumper(yaml.SafeDumper):
    """Text of several lines (a dashboard's JSON, a patch) as a literal block: readable, and diffs line by line."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _yaml(*objects: dict[str, Any]) -> str:
    return manifests.HEADER + "---\n".join(
        yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=120) for o in objects)


def _kustomization(resources: list[str], **more: Any) -> str:
    return _yaml({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                  "resources": resources, **more})


def render(settings: config.Config) -> dict[str, str]:
    """Each file's path below the output directory, and its text."""
    from gpufleet.dashboards.cli import rendered  # grafanalib: the dashboards extra, checked by `run`.

    values: Site = site(settings.kubernetes)
    watched = manifests.monitors(settings, values)
    delete = {**DELETE_SERVICE_MONITOR, "metadata": {"name": manifests.APP, "namespace": values.namespace}}
    base = {
        "namespace.yaml": _yaml({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": values.namespace}}),
        "exporter.yaml": _yaml(*manifests.exporter_objects(settings, values)),
        "servicemonitor.yaml": _yaml(watched["ServiceMonitor"]),
        "prometheusrule.yaml": _yaml(manifests.prometheus_rule(settings, values)),
        "alertmanagerconfig.yaml": _yaml(manifests.alertmanager_config(settings, values)),
        "dashboards.yaml": _yaml(*manifests.dashboard_configmaps(values, rendered(settings))),
    }
    return {
        # `kubectl apply -k DIR` installs the base; a variant is a kustomization beside it over the base (kustomize
        # refuses one below the directory it builds on).
        "kustomization.yaml": _kustomization(["base"]),
        **{f"base/{name}": text for name, text in base.items()},
        "base/kustomization.yaml": _kustomization(list(base)),
        # Scraped through a PodMonitor instead (no Service needed by the Operator).
        "podmonitor/podmonitor.yaml": _yaml(watched["PodMonitor"]),
        "podmonitor/kustomization.yaml": _kustomization(
            ["../base", "podmonitor.yaml"], patches=[{"patch": yaml.safe_dump({"$patch": "delete", **delete})}]),
        # With the opt-in dcgm-exporter compatibility layer.
        "dcgm-exporter/prometheusrule-dcgm.yaml": _yaml(manifests.prometheus_rule(settings, values, "dcgm")),
        "dcgm-exporter/kustomization.yaml": _kustomization(["../base", "prometheusrule-dcgm.yaml"]),
    }


def _write(directory: Path, files: dict[str, str]) -> None:
    """Each file whole or not at all: written beside, then renamed over the old one."""
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(partial, 0o644)  # mkstemp's 0600 would keep the manifests from the rest of a team.
        os.replace(partial, path)


def run(args: argparse.Namespace) -> int:
    if extras.missing("grafanalib", "dashboards", "deploy kubernetes"):
        return 2
    directory = checkout.directory(args.output, "deploy/kubernetes", "deploy kubernetes")
    if directory is None:
        return 2
    files = render(args.config)
    if not args.check:
        _write(directory, files)
        return 0
    stale = [name for name, text in files.items()
             if not (directory / name).is_file() or (directory / name).read_text(encoding="utf-8") != text]
    for name in stale:
        print(f"gpufleet deploy kubernetes: {directory / name} is out of date; run `gpufleet deploy kubernetes`",
              file=sys.stderr)
    return 1 if stale else 0
