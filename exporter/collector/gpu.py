"""GPU metrics and health through NVML, one series per GPU labelled by index and UUID.

The collector turns an `NvmlSession` sample, the jobs attribution found, the
XID ledger and the PCI bus into metric families; what is read, and how NVML
errors are handled, lives in `exporter.gpu`. Which NVML library sits behind the
session is the node's hardware (`exporter.node`), not the collector's choice.

When NVML fails as a whole, the collection still serves what does not depend
on it: `gpufleet_gpu_up` 0 for every GPU the node has had, the XID counts (the
XID that took the driver down is the one an operator needs), and the GPUs on
the PCI bus. When NVML hangs and the collection times out, or it fails, or before
the first collection after a start, the exporter serves what it keeps itself
(`held`): each GPU's held recovery action and the XID counts, with
`gpufleet_gpu_driver_up` 0 where NVML did not answer. A page for a GPU that
still needs its reset therefore never resolves because the driver stopped
answering or the exporter restarted.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from typing import ClassVar, Protocol

from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.samples import Sample

from gpufleet.exporter.collector import Collection, CollectorError, FamilySet
from gpufleet.exporter.gpu.actions import ActionBook
from gpufleet.exporter.gpu.gpm import metric_set
from gpufleet.exporter.gpu.inventory import Inventory
from gpufleet.exporter.gpu.jobs import Attribution, JobAttribution
from gpufleet.exporter.gpu.nvlink import NvlinkSummary
from gpufleet.exporter.gpu.podjobs import PodJobs, PodPatternError, compile_pattern
from gpufleet.exporter.gpu.podresources import PodResourcesClient
from gpufleet.exporter.gpu.probes import GpuMetric
from gpufleet.exporter.gpu.session import GpuIdentity, GpuUnavailable, NodeSample, NvmlSession
from gpufleet.exporter.gpu.xid import KernelLogXids, NvmlXidWatcher, XidCount, XidLedger
from gpufleet.exporter.hardware import Hardware, boot_time
from gpufleet.exporter.pci import device_kind
from gpufleet.exporter.state import PersistentState
from gpufleet.exporter.sysfs import SysfsReader
from gpufleet.exporter.tree import DiskTree, Tree
from gpufleet.flags import duration, positive_int

log = logging.getLogger(__name__)

_GPU_LABELS = ("gpu", "uuid")
_INFO_LABELS = ("gpu", "uuid", "name", "pci_bus_id", "serial", "vbios", "driver_version", "cuda_version")
_NVIDIA_DRIVER = "nvidia"  # The kernel module NVML talks to, as /sys/bus/pci/drivers names it.


class XidSource(Protocol):
    def start(self) -> None: ...

    def request_stop(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...


def _identity_series(families: FamilySet, identity: GpuIdentity, up: bool, driver: str, cuda: str) -> None:
    base = [str(identity.index), identity.uuid]
    families.gauge("gpufleet_gpu_up", "1 when the GPU answers NVML, 0 when it is lost.", _GPU_LABELS).add_metric(
        base, 1.0 if up else 0.0
    )
    families.gauge("gpufleet_gpu_info", "GPU metadata; the value is always 1.", _INFO_LABELS).add_metric(
        [*base, identity.name, identity.pci_bus_id, identity.serial, identity.vbios, driver, cuda], 1.0
    )


def add_sample(families: FamilySet, sample: NodeSample) -> None:
    """The metric families of one NVML sample: values for GPUs that answered, `up` 0 for the lost.

    A node has about two thousand GPU series, so samples are appended directly rather than through
    `add_metric`, and every sample with the same labels on one GPU shares one label dict, which the
    text writer then renders once.
    """
    families.gauge("gpufleet_gpu_devices", "GPUs that NVML enumerates.", ()).add_metric([], sample.device_count)
    targets: dict[GpuMetric, tuple[list[Sample], str]] = {}
    for gpu in sample.gpus:
        _identity_series(families, gpu.identity, True, sample.driver_version, sample.cuda_version)
        base = {"gpu": str(gpu.identity.index), "uuid": gpu.identity.uuid}
        shared: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, str]] = {}
        for reading in gpu.readings:
            metric = reading.metric
            target = targets.get(metric)
            if target is None:
                make = families.counter if metric.counter else families.gauge
                family = make(metric.name, metric.documentation, _GPU_LABELS + metric.labels)
                target = targets[metric] = (family.samples, family.name + ("_total" if metric.counter else ""))
            labels = base
            if metric.labels:
                key = (metric.labels, reading.label_values)
                labels = shared.get(key) or shared.setdefault(
                    key, {**base, **dict(zip(metric.labels, reading.label_values, strict=True))})
            target[0].append(Sample(target[1], labels, reading.value))
    for identity in sample.lost:
        _identity_series(families, identity, False, sample.driver_version, sample.cuda_version)


def add_xids(families: FamilySet, counts: Sequence[XidCount], watching: bool) -> None:
    labels = ("gpu", "uuid", "xid")
    for count in counts:
        values = [str(count.gpu), count.uuid, str(count.xid)]
        families.counter("gpufleet_gpu_xid_errors_total", "Critical XID events, every occurrence counted.",
                         labels).add_metric(values, count.count)
        families.gauge("gpufleet_gpu_xid_last_timestamp_seconds", "Unix time of the latest event of this XID.",
                       labels).add_metric(values, count.last_timestamp)
    families.gauge("gpufleet_gpu_xid_events_registered",
                   "1 while NVML XID events are registered for at least one GPU.", ()).add_metric(
        [], 1.0 if watching else 0.0
    )


def add_pci_devices(families: FamilySet, sysfs: SysfsReader) -> None:
    """NVIDIA GPUs the kernel sees on the PCI bus, whether or not NVML still lists them: those meant for NVML,
    bound to the nvidia driver or to none (a driver that failed to bind is what GpuMissingFromNvml is for), and
    apart, by driver, those bound to another on purpose (vfio-pci, for a VM), which NVML never lists."""
    if not sysfs.is_dir("bus/pci/devices"):
        return
    count, elsewhere = 0, Counter[str]()
    for device in sysfs.listdir("bus/pci/devices"):
        base = f"bus/pci/devices/{device}"
        if device_kind(sysfs, base) != "gpu":
            continue
        driver = (sysfs.readlink(f"{base}/driver") or "").rstrip("/").rpartition("/")[2]
        if driver in ("", _NVIDIA_DRIVER):
            count += 1
        else:
            elsewhere[driver] += 1
    families.gauge("gpufleet_gpu_pci_devices", "NVIDIA GPUs on the PCI bus meant for NVML (bound to the nvidia "
                   "driver, or to none), as the kernel lists them.", ()).add_metric([], count)
    for driver, number in sorted(elsewhere.items()):
        families.gauge("gpufleet_gpu_pci_devices_other_driver", "NVIDIA GPUs on the PCI bus bound to another driver "
                       "(vfio-pci for a VM), which NVML does not list.", ("driver",)).add_metric([driver], number)


def add_jobs(families: FamilySet, attribution: Attribution) -> None:
    """The process count, job and per-process memory series of each GPU that can list its processes."""
    # Series of these two families carry differing label sets (only the labels that apply): built directly.
    info = GaugeMetricFamily("gpufleet_gpu_job_info", "A job using the GPU; the value is always 1.")
    memory = GaugeMetricFamily("gpufleet_gpu_process_memory_used_bytes", "GPU memory used by one process.")
    for found in attribution.gpus:
        base = {"gpu": str(found.gpu.index), "uuid": found.gpu.uuid}
        families.gauge("gpufleet_gpu_processes", "Compute processes running on the GPU.", _GPU_LABELS).add_metric(
            list(base.values()), found.processes)
        for labels in found.jobs:
            info.add_sample(info.name, {**base, **labels}, 1.0)
        for labels, used in found.process_memory:
            memory.add_sample(memory.name, {**base, **labels}, float(used))
    families.add(info)
    families.add(memory)


def _collections_in(seconds: float, args: argparse.Namespace) -> int:
    """How many GPU collections `seconds` spans at the flags' GPU interval, at least one."""
    every: int = max(1, round(seconds / args.collector_gpu_interval))
    return every


def slow_every(args: argparse.Namespace) -> int:
    """How many GPU collections the flags' slow interval spans: the slow reads come at every this many."""
    return _collections_in(args.gpu_slow_interval, args)


def counter_every(args: argparse.Namespace) -> int:
    """How many GPU collections the flags' counter interval spans: the dear counters come at every this many."""
    return _collections_in(args.gpu_counter_interval, args)


class GpuCollector:
    name: ClassVar[str] = "gpu"
    default_interval: ClassVar[float] = 5.0

    def __init__(self, session: NvmlSession, *, sysfs: Tree | None = None, procfs: Tree | None = None,
                 jobs: JobAttribution | None = None, xids: XidLedger | None = None,
                 xid_sources: Sequence[XidSource] = (), kernel_xids: KernelLogXids | None = None,
                 nvlink_per_link: bool = False, state: PersistentState | None = None,
                 expected_count: int | None = None) -> None:
        self.session = session
        self.nvlinks = NvlinkSummary(nvlink_per_link)
        self.sysfs = sysfs
        self.procfs = procfs
        self.jobs = jobs
        self.xids = xids if xids is not None else XidLedger()
        self.xid_sources = tuple(xid_sources)
        self.kernel_xids = kernel_xids
        # On the ledger's clock, waiting twice as long as the ledger may hold a kernel-log XID before counting it
        # (once more for the log's reader to reach the line): the XID that tells a contained memory error from an
        # uncontained one can follow the error count by that much.
        self.actions = ActionBook(self.xids.clock, xid_wait=2 * self.xids.dedup_window)
        self.state = state or PersistentState()
        # What a previous process kept. Where it says which GPUs the node had, it applies at once, so that it is
        # served before the first collection and through a driver that hangs from the start, and what a board
        # replaced while no exporter watched left behind is dropped at the first sample (`_verify`); a file too
        # old to say applies once this process has seen the node's GPUs.
        self._kept: dict[str, object] | None = self.state.section(self.name)
        self.inventory = Inventory(self._kept.get("gpus"), expected_count)
        if self.inventory.ignored:
            self.state.ignored(self.inventory.ignored)
        self._unverified: dict[str, GpuIdentity] = dict(self.inventory.gpus)
        if self._unverified:
            self._restore(list(self._unverified.values()))
        # Whether NVML answered the last collection: not yet, before the first. A scrape before it must hold the
        # node's GPU pages as a hung driver's does, whatever their series.
        self._answered = False
        # The collection's worker thread and the event loop's `held` share the action book, the ledger and the
        # kernel log reader: never held across an NVML call, which may hang.
        self._lock = threading.Lock()

    @staticmethod
    def add_arguments(parser: argparse._ArgumentGroup) -> None:
        parser.add_argument("--collector.gpu.xid-kmsg", dest="gpu_xid_kmsg", action=argparse.BooleanOptionalAction,
                            default=True, help="also count XIDs from the kernel log (--path.kmsg) where it is "
                                               "readable, each once with NVML's events: the XIDs of a driver that "
                                               "hangs reach only the kernel log; and hold the board's GPUs at a "
                                               "reset for a fatal NVSwitch error (SXid), which only the kernel log "
                                               "tells (default: on)")
        parser.add_argument("--collector.gpu.expected-count", dest="gpu_expected_count", type=positive_int,
                            metavar="N", help="the GPUs this node should have: a GPU it had that NVML no longer "
                                              "lists is reported lost, also after a restart or a reboot, until it "
                                              "answers again or this many GPUs answer without it, which declares it "
                                              "taken out on purpose (default: every GPU the node has had)")
        parser.add_argument("--job.mapping-dir", dest="job_mapping_dir", metavar="DIR",
                            help="dcgm-exporter style job mapping: one file per GPU index listing job ids")
        parser.add_argument("--job.pod-resources", dest="job_pod_resources", action=argparse.BooleanOptionalAction,
                            default=False, help="name Kubernetes pods through the kubelet's pod-resources socket "
                                                "(needs grpcio; default: off)")
        parser.add_argument("--job.pod-pattern", dest="job_pod_pattern", metavar="REGEX",
                            help="a regular expression with a group named job that finds a pod's training job in its "
                                 "name, tried before the training operators' naming (JobSet, Indexed Job, Kubeflow); "
                                 "needs --job.pod-resources")
        parser.add_argument("--path.pod-resources-socket", dest="pod_resources_socket",
                            default="/var/lib/kubelet/pod-resources/kubelet.sock", metavar="PATH",
                            help="the kubelet's pod-resources socket (default: %(default)s)")
        parser.add_argument("--collector.gpu.process-memory", dest="gpu_process_memory",
                            action=argparse.BooleanOptionalAction, default=False,
                            help="export GPU memory per process (series churn with pids; default: off)")
        parser.add_argument("--collector.gpu.nvlink-per-link", dest="gpu_nvlink_per_link",
                            action=argparse.BooleanOptionalAction, default=False,
                            help="export every NVLink's state, errors and traffic (126 series per H100); by default "
                                 "each GPU gets totals over its links, and a link its own series only while it is "
                                 "down or once it has counted errors (default: off)")
        parser.add_argument("--collector.gpu.gpm", dest="gpu_gpm", action=argparse.BooleanOptionalAction,
                            default=True, help="read graphics-engine, SM, tensor and DRAM activity and PCIe "
                                               "throughput through NVML's GPU Performance Monitoring where the board "
                                               "has it (Hopper and newer; 6 series per GPU; default: on)")
        parser.add_argument("--collector.gpu.slow-interval", dest="gpu_slow_interval", type=duration, default=15.0,
                            metavar="DURATION",
                            help="how often to read the gauges that cost the driver a millisecond or more a GPU and "
                                 "change slowly: thermal margin, NVSwitch fabric registration; rounded to whole GPU "
                                 "collections, between which the last values are served (default: %(default)gs)")
        parser.add_argument("--collector.gpu.counter-interval", dest="gpu_counter_interval", type=duration,
                            default=60.0, metavar="DURATION",
                            help="how often to read the counters that cost the driver a millisecond or more a GPU and "
                                 "are only read as rates or increases over minutes: energy, clock violation time, "
                                 "PCIe replays, NVLink errors; and the pending ECC and persistence modes; rounded to "
                                 "whole GPU collections, between which the last values are served "
                                 "(default: %(default)gs)")
        parser.add_argument("--collector.gpu.gpm-detail", dest="gpu_gpm_detail",
                            action=argparse.BooleanOptionalAction, default=False,
                            help="also export SM occupancy, each tensor pipe's and each FP precision's activity and "
                                 "GPM's NVLink throughput (10 more series per GPU; default: off)")

    @classmethod
    def from_args(cls, args: argparse.Namespace, hardware: Hardware) -> GpuCollector:
        if args.job_pod_pattern is not None and not args.job_pod_resources:
            raise CollectorError("--job.pod-pattern reads pod names, which need --job.pod-resources")
        try:
            site = compile_pattern(args.job_pod_pattern) if args.job_pod_pattern is not None else None
        except PodPatternError as err:
            raise CollectorError(str(err)) from None
        # A kernel-log XID waits this long for NVML's event of it before it counts: longer than a collection, at
        # which the log is read.
        ledger = XidLedger(dedup_window=max(10.0, 2 * args.collector_gpu_interval))
        sources: list[XidSource] = [NvmlXidWatcher(hardware.nvml, ledger, wait_ms=hardware.nvml_event_wait_ms)]
        kernel_xids = None
        if args.gpu_xid_kmsg and hardware.kernel_log is not None:
            kernel_xids = KernelLogXids(hardware.kernel_log, ledger)
        pod_resources = None
        if args.job_pod_resources:
            try:
                pod_resources = PodResourcesClient(args.pod_resources_socket)
            except ImportError:
                raise CollectorError("--job.pod-resources needs the grpcio package: "
                                     "pip install 'gpufleet[kubernetes]'") from None
        mapping = DiskTree(args.job_mapping_dir) if args.job_mapping_dir else None
        jobs = JobAttribution(hardware.procfs, mapping, args.gpu_process_memory, pod_resources, PodJobs(site))
        gpm = metric_set(args.gpu_gpm_detail) if args.gpu_gpm else ()
        session = NvmlSession(hardware.nvml, gpm=gpm, slow_every=slow_every(args), counter_every=counter_every(args))
        return cls(session, sysfs=hardware.sysfs, procfs=hardware.procfs, jobs=jobs, xids=ledger, xid_sources=sources,
                   kernel_xids=kernel_xids, nvlink_per_link=args.gpu_nvlink_per_link, state=hardware.state,
                   expected_count=args.gpu_expected_count)

    def start(self) -> None:
        for source in self.xid_sources:
            source.start()
        if self.kernel_xids is not None:
            with self._lock:
                self.kernel_xids.start()

    def stop(self) -> None:
        for source in self.xid_sources:
            source.request_stop()

    def collect(self) -> Collection:
        families = FamilySet()
        problems: list[str] = []
        counts: list[XidCount] | None = None  # The XID counts the sample's actions were raised from.
        with self._lock:
            if self.kernel_xids is not None:
                self.kernel_xids.poll()
        # Taken before the sample, so that each verdict is older than what the sample reads and is acted on first;
        # one announced while NVML answers for no GPU is moot, since the GPU's return settles what it asked for.
        verdicts = self.xids.take_verdicts()
        try:
            sample = self.session.sample()
        except GpuUnavailable as err:
            problems.append(str(err))
            self._unavailable(families)
        else:
            sample = dataclasses.replace(sample, gpus=tuple(
                dataclasses.replace(gpu, readings=tuple(self.nvlinks.apply(gpu.identity.uuid, gpu.readings)))
                for gpu in sample.gpus))
            with self._lock:
                sample, counts = self._observe(sample, verdicts)
                self._answered = True
            add_sample(families, sample)
            problems.extend(sample.problems)
            if self.jobs is not None:
                attribution = self.jobs.attribute(sample.gpus)
                add_jobs(families, attribution)
                problems.extend(attribution.problems)
        with self._lock:
            kept = self._add_kept(families, counts)
        if kept is not None:  # Written outside the lock, which `held` takes in the event loop: a disk that stalls
            self.state.update(self.name, kept)  # stalls this collection, not every scrape.
        if self.sysfs is not None:
            sysfs = SysfsReader(self.sysfs)
            add_pci_devices(families, sysfs)
            problems.extend(sysfs.problems)
        return families.collection(problems)

    def held(self, hung: bool) -> Collection:
        """What the exporter keeps itself: the held actions, raised further by the XIDs the kernel log still tells,
        and the XID counts, with `gpufleet_gpu_driver_up` 0 where the collection hung in NVML (one that raised is
        the exporter's fault, and its collector's ticket, not the driver's). Runs in the event loop's thread,
        perhaps while that collection still waits; saves nothing, which the next collection does."""
        families = FamilySet()
        with self._lock:
            if hung:
                self._answered = False
            if self.kernel_xids is not None:
                self.kernel_xids.poll()
            counts = self.xids.snapshot()
            if self._kept is None:
                boot = boot_time(self.procfs)
                for change in [*self.actions.raise_from_xids(counts, boot),
                               *self.actions.raise_board(self.xids.take_fatal_sxids(), boot)]:
                    log.info("%s", change)
            self._add_kept(families, counts)
        return families.collection()

    def _unavailable(self, families: FamilySet) -> None:
        """NVML as a whole cannot be used: every GPU the node has had is lost, and keeps its held action."""
        with self._lock:
            self._answered = False
            for identity in {**self.inventory.gpus,
                             **{g.pci_bus_id: g for g in self.session.known_gpus()}}.values():
                _identity_series(families, identity, False, self.session.driver_version, self.session.cuda_version)
            self.actions.absent()

    def _observe(self, sample: NodeSample, verdicts: dict[str, list[int]]) -> tuple[NodeSample, list[XidCount]]:
        """Take one sample's GPUs into the inventory and the action book; returns it with the GPUs the node had
        that NVML no longer lists added to its lost ones, and the XID counts the actions were raised from."""
        answering = {gpu.identity.pci_bus_id for gpu in sample.gpus}
        # The session knows lost GPUs by index, which NVML renumbers when it lists fewer: not one that answers.
        sample = dataclasses.replace(sample, lost=tuple(g for g in sample.lost if g.pci_bus_id not in answering))
        for gpu in sample.gpus:  # Lets kernel-log XIDs be matched to GPUs even if NVML events are off.
            self.xids.register_gpu(gpu.identity.index, gpu.identity.uuid, gpu.identity.pci_bus_id)
        self._verify(sample)
        for identity in self.inventory.settle(gpu.identity for gpu in sample.gpus):
            log.info("GPU %d (%s) at %s is no longer expected: %d GPUs answer, as declared", identity.index,
                     identity.uuid, identity.pci_bus_id, self.inventory.expected or 0)
            self.actions.forget(identity.pci_bus_id)
        missing = self.inventory.missing([*(gpu.identity for gpu in sample.gpus), *sample.lost])
        sample = dataclasses.replace(sample, lost=(*sample.lost, *missing))
        if self._kept is not None:
            self._restore([*(gpu.identity for gpu in sample.gpus), *sample.lost])
        counts = self.xids.snapshot()
        boot = boot_time(self.procfs)
        for change in [*self.actions.observe(sample.gpus, sample.lost, counts, boot, verdicts),
                       *self.actions.raise_board(self.xids.take_fatal_sxids(), boot)]:
            log.info("%s", change)
        return sample, counts

    def _add_driver(self, families: FamilySet) -> None:
        families.gauge("gpufleet_gpu_driver_up", "1 when NVML answered the last GPU collection; 0 before the first, "
                       "when NVML is unavailable, or when the collection timed out (a hung driver).",
                       ()).add_metric([], 1.0 if self._answered else 0.0)

    def _add_kept(self, families: FamilySet, counts: Sequence[XidCount] | None) -> dict[str, object] | None:
        """The XID counts and the held recovery actions, exported; returns them as the next process is to find
        them, or None before the kept state is carried over, which they would overwrite. `counts` are those the
        actions were raised from, so that a kernel-log XID counted between two snapshots (its wait for NVML's
        event over) is not served beside the action it has not raised yet; None where no sample was taken."""
        add_xids(families, self.xids.snapshot() if counts is None else counts, self.xids.watching)
        for family in self.actions.families():
            families.add(family)
        self._add_driver(families)
        if self._kept is not None:
            return None
        return {"xids": self.xids.kept(), "actions": self.actions.kept(), "gpus": self.inventory.kept()}

    def _restore(self, identities: Sequence[GpuIdentity]) -> None:
        """Carry over what a previous process kept, once: the XID counts and held actions of `identities`, the GPUs
        this node has (or had, by the kept inventory). Entries for others (replaced boards, GPUs declared taken
        out, or a file from another host) are dropped."""
        if self._kept is None:
            return
        kept, self._kept = self._kept, None
        for identity in identities:  # Kernel-log XIDs find their GPU before NVML has listed it.
            self.xids.register_gpu(identity.index, identity.uuid, identity.pci_bus_id)
        xids, actions = kept.get("xids", []), kept.get("actions", {})
        ignored, carried = self.xids.restore(xids if isinstance(xids, list) else [],
                                             {identity.uuid: identity.index for identity in identities})
        slots = {identity.pci_bus_id: identity.uuid for identity in identities}
        dropped, settled = self.actions.restore(actions if isinstance(actions, dict) else {}, slots, carried)
        self.actions.know(identities)
        for line in settled:
            log.info("%s", line)
        self._ignore(ignored + dropped)

    def _verify(self, sample: NodeSample) -> None:
        """At the first sample after a start, drop what the kept inventory's boards left where another board now
        answers: the board was replaced while no exporter watched, or the file is another host's."""
        unverified, self._unverified = self._unverified, {}
        dropped = 0
        for gpu in sample.gpus:
            old = unverified.get(gpu.identity.pci_bus_id)
            if old is None or old.uuid == gpu.identity.uuid:
                continue
            held = self.actions.held.get(old.pci_bus_id)
            if held is not None and held.uuid == old.uuid:
                log.info("the GPU at %s no longer needs %s: another board (%s) sits there", old.pci_bus_id,
                         held.action.name.lower(), gpu.identity.uuid)
                self.actions.forget(old.pci_bus_id)
                dropped += 1
            dropped += self.xids.forget(old.uuid)
        self._ignore(dropped)

    def _ignore(self, entries: int) -> None:
        if entries:
            log.warning("the state file holds %d entries for GPUs this node does not have (replaced boards, or "
                        "another host's file); they are not carried over", entries)
            self.state.ignored(entries)

    def close(self) -> None:
        for source in self.xid_sources:
            source.stop()
        if self.kernel_xids is not None:
            with self._lock:
                self.kernel_xids.close()
        self.session.close()
        if self.jobs is not None and self.jobs.pod_resources is not None:
            self.jobs.pod_resources.close()
