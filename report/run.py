"""Running a report: which sections can be computed, computing them, and saying what failed.

A section fails alone. Missing metrics are named before any query is sent (from the label index, which
is cheap for any range); a query Prometheus rejects fails only the sections that asked it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gpufleet.alerts.config import Config
from gpufleet.alerts.rules import groups as rule_groups
from gpufleet.alerts.rules import recorded_by
from gpufleet.report.document import Failure, Report, Section
from gpufleet.report.progress import Progress
from gpufleet.report.prometheus import Prometheus, QueryFailed, Unreachable
from gpufleet.report.query import Queries, Window
from gpufleet.report.spec import ReportSpec, SectionError, SectionSpec

log = logging.getLogger(__name__)


class NothingToReport(Exception):
    """The range holds no gpufleet data at all: no section could say anything."""


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _missing(spec: SectionSpec, names: set[str]) -> list[str]:
    return [need for need in spec.requires if not any(n in names for n in need.split("|"))]


def _why(missing: list[str], config: Config) -> str:
    """What a section lacks, and which rule groups record it: a report run before the rules were loaded, or
    over a range from before then, finds the exporters' raw series but none of what it reads."""
    group_of = recorded_by(rule_groups(config))
    groups = list(dict.fromkeys(group_of[name] for need in missing for name in need.split("|") if name in group_of))
    why = f"no samples of {', '.join(need.replace('|', ' or ') for need in missing)} in the range"
    if not groups:
        return why
    listed = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
    return (f"{why} (recorded by the rule group{'s' if len(groups) > 1 else ''} {listed} in "
            "alerts/gpufleet-rules.yml: load it into this Prometheus; the report covers the time since)")


async def _section(spec: SectionSpec, queries: Queries, progress: Progress) -> Section | Failure:
    try:
        return await spec.build(queries)
    except SectionError as error:
        return Failure(spec.title, str(error))
    except QueryFailed as error:
        return Failure(spec.title, f"Prometheus rejected a query: {error}")
    except Unreachable as error:  # Lost mid-report: the sections already computed still stand.
        return Failure(spec.title, str(error))
    except Exception as error:  # A bug in one section must not cost the reader the others; it is logged.
        log.exception("section %s failed", spec.key)
        return Failure(spec.title, f"internal error ({type(error).__name__}: {error}); please report it")
    finally:
        progress.section_done()


async def build(report_spec: ReportSpec, prometheus: Prometheus, window: Window, progress: Progress,
                config: Config | None = None) -> Report:
    """The report, with its queries counted on `progress`; raises Unreachable or NothingToReport."""
    version = await prometheus.check()
    names = await prometheus.metric_names(window.start, window.end)
    period = f"{_stamp(window.start)} to {_stamp(window.end)} ({window.seconds / 86400:g} days)"
    if not any(name.startswith("gpufleet_gpu_") for name in names):
        raise NothingToReport(f"no gpufleet GPU metrics in {prometheus.url} from {period}: check the range "
                              "(and the server's retention) and that this Prometheus scrapes the gpufleet exporters")
    config = config or Config()
    queries = Queries(prometheus, window, progress.query_done, config)
    report = Report(report_spec.title, period, f"{prometheus.url} (Prometheus {version})", _stamp(time.time()),
                    report_spec.method(window, config))
    runnable = []
    for spec in report_spec.sections:
        missing = _missing(spec, names)
        if missing:
            report.failures.append(Failure(spec.title, _why(missing, config)))
            progress.section_done()
        else:
            runnable.append(spec)
    for outcome in await asyncio.gather(*(_section(spec, queries, progress) for spec in runnable)):
        if isinstance(outcome, Failure):
            report.failures.append(outcome)
        else:
            report.sections.append(outcome)
    order = [spec.key for spec in report_spec.sections]
    report.sections.sort(key=lambda s: order.index(s.key))
    return report
