"""Running the capacity report: which sections can be computed, computing them, and saying what failed.

A section fails alone. Missing metrics are named before any query is sent (from the label index, which
is cheap for any range); a query Prometheus rejects fails only the sections that asked it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gpufleet.alerts.config import Config
from gpufleet.report.capacity import SECTIONS, SectionError, SectionSpec
from gpufleet.report.document import Failure, Report, Section
from gpufleet.report.progress import Progress
from gpufleet.report.prometheus import Prometheus, QueryFailed, Unreachable
from gpufleet.report.query import Queries, Window

log = logging.getLogger(__name__)


class NothingToReport(Exception):
    """The range holds no gpufleet data at all: no section could say anything."""


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _missing(spec: SectionSpec, names: set[str]) -> list[str]:
    return [need.replace("|", " or ") for need in spec.requires if not any(n in names for n in need.split("|"))]


def _hint(missing: list[str]) -> str:
    if not any(":" in name for name in missing):
        return ""
    return (" (recorded by the rule group gpufleet-capacity in alerts/gpufleet-rules.yml: load it into this "
            "Prometheus; the report covers the time since)")


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


async def capacity(prometheus: Prometheus, window: Window, progress: Progress, config: Config | None = None) -> Report:
    """The report, with its queries counted on `progress`; raises Unreachable or NothingToReport."""
    version = await prometheus.check()
    names = await prometheus.metric_names(window.start, window.end)
    period = f"{_stamp(window.start)} to {_stamp(window.end)} ({window.seconds / 86400:g} days)"
    if not any(name.startswith("gpufleet_gpu_") for name in names):
        raise NothingToReport(f"no gpufleet GPU metrics in {prometheus.url} from {period}: check the range "
                              "(and the server's retention) and that this Prometheus scrapes the gpufleet exporters")
    config = config or Config()
    queries = Queries(prometheus, window, progress.query_done, config)
    report = Report("GPU fleet capacity report", period, f"{prometheus.url} (Prometheus {version})",
                    _stamp(time.time()),
                    [f"Figures over the range are sampled every {window.step // 60} minutes "
                     "(a Prometheus subquery at that step) from the series that the gpufleet-capacity rules "
                     "record every 5 minutes; GPU-hours are samples times the step.",
                     "A GPU is allocated while gpufleet_gpu_job_info attributes a job to it, idle while it is "
                     "healthy and has none, and lost while gpufleet_gpu_up is 0.",
                     f"Clusters are the `{config.cluster_label}` label of the scraped series; \u2014 means the "
                     "series have none."])
    runnable = []
    for spec in SECTIONS:
        missing = _missing(spec, names)
        if missing:
            why = f"no samples of {', '.join(missing)} in the range{_hint(missing)}"
            report.failures.append(Failure(spec.title, why))
            progress.section_done()
        else:
            runnable.append(spec)
    for outcome in await asyncio.gather(*(_section(spec, queries, progress) for spec in runnable)):
        if isinstance(outcome, Failure):
            report.failures.append(outcome)
        else:
            report.sections.append(outcome)
    order = [spec.key for spec in SECTIONS]
    report.sections.sort(key=lambda s: order.index(s.key))
    return report
