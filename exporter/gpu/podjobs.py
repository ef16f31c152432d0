"""Which training job a Kubernetes pod belongs to, read from its name, so that the pods of one job are compared
with each other rather than with every busy node of the same GPU model.

A node cannot ask the API server who owns a pod, but the training operators name their pods after the job:

* JobSet (and Kubeflow Trainer, which runs on it): `<jobset>-<replicated job>-<job index>-<pod index>-<suffix>`;
  the job is `<jobset>-<replicated job>`, whose pods do the same work;
* an Indexed Job (each of JobSet's children is one): `<job>-<index>-<suffix>`;
* Kubeflow's training operator (PyTorchJob, MPIJob, TFJob, XGBoostJob) and Volcano's master/worker tasks:
  `<job>-<role>-<index>`, where the role is master, worker, launcher, chief, ps or evaluator.

The suffix is the five characters Kubernetes draws for generated names, from an alphabet without vowels or the
digits 0, 1 and 3, so a name that merely ends in a five-letter word is not taken for one. A site whose pods are
named otherwise gives its own pattern (`--job.pod-pattern`), tried first. The job id is `<namespace>/<job>`:
two namespaces may run jobs of the same name. A StatefulSet named like a role (`vllm-worker-0`) reads as a job
too: its replicas do the same work, and are compared as one job's.
"""

from __future__ import annotations

import re

_SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"
# Indices of at most five digits: a CronJob's pods carry an eight-digit time stamp where an Indexed Job's carry
# its index, and a ReplicaSet's hash has nine or ten characters.
OPERATOR_PATTERNS = (
    rf"(?P<job>.+)-\d{{1,5}}-\d{{1,5}}-{_SUFFIX}",  # JobSet
    rf"(?P<job>.+)-\d{{1,5}}-{_SUFFIX}",  # Indexed Job
    r"(?P<job>.+)-(?:master|worker|launcher|chief|ps|evaluator)-\d{1,5}",  # Kubeflow, Volcano
)


class PodPatternError(ValueError):
    """A site's pod pattern that cannot name a job."""


def compile_pattern(text: str) -> re.Pattern[str]:
    """A site's pattern, checked: a regular expression with a group named `job`, matched against the whole name."""
    try:
        pattern = re.compile(text)
    except re.error as err:
        raise PodPatternError(f"--job.pod-pattern {text!r}: not a regular expression: {err}") from None
    if "job" not in pattern.groupindex:
        raise PodPatternError(f"--job.pod-pattern {text!r}: needs a group named job, as in (?P<job>.+)-worker-\\d+")
    return pattern


class PodJobs:
    """Names the training job of a pod from its name: the site's pattern first, then the operators'."""

    def __init__(self, site: re.Pattern[str] | None = None) -> None:
        self.patterns = ([site] if site is not None else []) + [re.compile(p) for p in OPERATOR_PATTERNS]

    def job_id(self, namespace: str, pod: str) -> str | None:
        """`<namespace>/<job>` for a pod whose name follows a pattern, else None."""
        for pattern in self.patterns:
            match = pattern.fullmatch(pod)
            if match and match.group("job"):
                return f"{namespace}/{match.group('job')}"
        return None
