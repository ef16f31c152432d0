"""GPU Performance Monitoring (GPM): how much of the GPU did work, not only whether a kernel ran.

`gpufleet_gpu_utilization_ratio` is NVML's share of time in which any kernel ran: one kernel on one
SM, or NCCL spinning while it waits for a late peer, reads 100 %. Hopper and newer boards count what
the SMs, tensor pipes and DRAM actually did, and NVML computes the shares from two samples of those
counters (`nvmlGpmMetricsGet`), without a DCGM daemon. These are the measurements dcgm-exporter's
profiling fields (SM active, SM occupancy, tensor active, DRAM active) give.

On a GPU in MIG mode each GPU instance is sampled on its own (`nvmlGpmMigSampleGet`), so activity
can be read per instance and summed to the physical GPU (`exporter.gpu.mig`).

A metric spans the interval between two samples, so each GPU keeps its previous sample from one
collection to the next instead of sleeping between two inside one; the first collection after a GPU
opens only takes a sample. A board that does not support GPM (before Hopper, or refused) is found
once when the GPU opens and gets no series, never zeros; a single metric the board refuses is left
out the first time it is refused, with one log line.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import pynvml

from gpufleet.exporter.gpu.nvml import UNSUPPORTED, GpmSample, Handle, Nvml
from gpufleet.exporter.gpu.probes import GpuMetric, Reading

log = logging.getLogger(__name__)

GRAPHICS_ACTIVE = GpuMetric(
    "gpufleet_gpu_graphics_active_ratio",
    "Share of time the graphics or compute engine ran a kernel, over the collection interval (NVML GPM; "
    "dcgm-exporter's GR_ENGINE_ACTIVE).",
)
SM_ACTIVE = GpuMetric(
    "gpufleet_gpu_sm_active_ratio",
    "Share of SMs busy, averaged over the collection interval (NVML GPM; Hopper and newer).",
)
SM_OCCUPANCY = GpuMetric(
    "gpufleet_gpu_sm_occupancy_ratio",
    "Resident warps as a share of the SMs' maximum, averaged over the collection interval (NVML GPM).",
)
TENSOR_ACTIVE = GpuMetric(
    "gpufleet_gpu_tensor_active_ratio",
    "Share of time the SMs' tensor pipes (any of them) were busy over the collection interval (NVML GPM).",
)
TENSOR_PIPE_ACTIVE = GpuMetric(
    "gpufleet_gpu_tensor_pipe_active_ratio",
    "Share of time one kind of tensor operation ran over the collection interval (NVML GPM): hmma half and "
    "mixed precision, imma integer, dmma and dfma double precision.",
    labels=("pipe",),
)
DRAM_ACTIVE = GpuMetric(
    "gpufleet_gpu_dram_active_ratio",
    "Device memory bandwidth used, as a share of the board's theoretical maximum, over the collection "
    "interval (NVML GPM).",
)
FP_ACTIVE = GpuMetric(
    "gpufleet_gpu_fp_active_ratio",
    "Share of time the SMs ran non-tensor floating-point math of one precision over the collection "
    "interval (NVML GPM).",
    labels=("precision",),
)
PCIE_THROUGHPUT = GpuMetric(
    "gpufleet_gpu_pcie_throughput_bytes_per_second",
    "PCIe traffic of the GPU, averaged over the collection interval (NVML GPM).",
    labels=("direction",),
)
NVLINK_THROUGHPUT = GpuMetric(
    "gpufleet_gpu_nvlink_throughput_bytes_per_second",
    "NVLink traffic of the GPU over all its links, averaged over the collection interval (NVML GPM).",
    labels=("direction",),
)

_PERCENT = 100.0
_MIB = 1024 * 1024
_MAX_BYTES_PER_SECOND = 2.0**50  # A PB/s: past anything a link carries, so only a broken value is dropped.


@dataclass(frozen=True)
class GpmMetric:
    """One GPM metric id and the reading it becomes: a share (NVML gives 0-100) or a rate (NVML gives MiB/s)."""

    metric_id: int
    description: str
    metric: GpuMetric
    label_values: tuple[str, ...] = ()
    rate: bool = False

    def readings(self, raw: float, prefix: tuple[str, ...] = ()) -> list[Reading]:
        """The reading of a raw value in NVML's unit; `prefix` holds the values of labels before the metric's own
        (a MIG GPU instance)."""
        if self.rate:
            if not 0 <= raw * _MIB <= _MAX_BYTES_PER_SECOND:  # NaN fails this too.
                return []
            return [Reading(self.metric, raw * _MIB, prefix + self.label_values)]
        if not 0 <= raw <= _PERCENT:
            return []
        return [Reading(self.metric, raw / _PERCENT, prefix + self.label_values)]


def _share(metric_id: int, description: str, metric: GpuMetric, *labels: str) -> GpmMetric:
    return GpmMetric(metric_id, description, metric, labels)


def _rate(metric_id: int, description: str, metric: GpuMetric, direction: str) -> GpmMetric:
    return GpmMetric(metric_id, description, metric, (direction,), rate=True)


# The default set, six series per GPU: dcgm-exporter's default profiling fields, plus SM active (commented
# out there, and wanted here: it tells a job that fills the SMs from one that does not).
METRICS: tuple[GpmMetric, ...] = (
    _share(pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics active", GRAPHICS_ACTIVE),
    _share(pynvml.NVML_GPM_METRIC_SM_UTIL, "SM active", SM_ACTIVE),
    _share(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "tensor active", TENSOR_ACTIVE),
    _share(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "DRAM active", DRAM_ACTIVE),
    _rate(pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "PCIe transmit", PCIE_THROUGHPUT, "transmit"),
    _rate(pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "PCIe receive", PCIE_THROUGHPUT, "receive"),
)
# Behind --collector.gpu.gpm-detail, ten more per GPU: how full the SMs were, which kind of math ran, and NVLink
# traffic as GPM sees it (the per-GPU NVLink byte counters, exported by default, carry the same traffic).
DETAIL: tuple[GpmMetric, ...] = (
    _share(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, "SM occupancy", SM_OCCUPANCY),
    _share(pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "HMMA tensor active", TENSOR_PIPE_ACTIVE, "hmma"),
    _share(pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "IMMA tensor active", TENSOR_PIPE_ACTIVE, "imma"),
    _share(pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL, "DMMA tensor active", TENSOR_PIPE_ACTIVE, "dmma"),
    _share(pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "DFMA tensor active", TENSOR_PIPE_ACTIVE, "dfma"),
    _share(pynvml.NVML_GPM_METRIC_FP16_UTIL, "FP16 active", FP_ACTIVE, "fp16"),
    _share(pynvml.NVML_GPM_METRIC_FP32_UTIL, "FP32 active", FP_ACTIVE, "fp32"),
    _share(pynvml.NVML_GPM_METRIC_FP64_UTIL, "FP64 active", FP_ACTIVE, "fp64"),
    _rate(pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "NVLink transmit", NVLINK_THROUGHPUT, "transmit"),
    _rate(pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "NVLink receive", NVLINK_THROUGHPUT, "receive"),
)


def _per_instance(metric: GpuMetric, name: str) -> GpuMetric:
    return GpuMetric(name, metric.documentation.replace("(NVML GPM", "(NVML GPM, one MIG GPU instance"),
                     labels=("gpu_instance",))


# Per MIG GPU instance: what its slice of the SMs and memory did. PCIe and NVLink stay with the physical GPU.
MIG_METRICS: tuple[GpmMetric, ...] = tuple(
    GpmMetric(m.metric_id, m.description, _per_instance(m.metric, m.metric.name.replace("gpufleet_gpu_",
                                                                                        "gpufleet_gpu_mig_")))
    for m in METRICS if not m.rate)


def metric_set(detail: bool) -> tuple[GpmMetric, ...]:
    """The GPM metrics the flags ask for."""
    return METRICS + DETAIL if detail else METRICS


class GpmReader:
    """One GPU's GPM samples, kept between collections; built when the GPU opens and freed when it closes."""

    def __init__(self, gpu: int, metrics: tuple[GpmMetric, ...], gpu_instance: int | None = None) -> None:
        self._gpu = gpu
        self._metrics = metrics
        self._gpu_instance = gpu_instance  # Sampled per MIG GPU instance, and labelled with it.
        self._prefix = () if gpu_instance is None else (str(gpu_instance),)
        self._samples: list[GpmSample] = []  # [previous, current] once allocated.
        self._primed = False  # Whether `previous` holds a sample taken by the last collection.
        self._request: pynvml.c_nvmlGpmMetricsGet_t | None = None
        self._answers: list[pynvml.c_nvmlGpmMetric_t] = []  # The request's metric slots, each read once a cycle.

    def read(self, nvml: Nvml, handle: Handle) -> list[Reading]:
        """Take a sample, and return the metrics over the interval since the previous collection's."""
        if not self._samples:
            self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        previous, current = self._samples
        if self._gpu_instance is None:
            nvml.nvmlGpmSampleGet(handle, current)
        else:
            nvml.nvmlGpmMigSampleGet(handle, self._gpu_instance, current)
        self._samples.reverse()  # This sample is the next collection's previous one, whatever follows.
        if not self._primed:
            self._primed = True
            return []
        request = self._request or self._build_request()
        request.sample1, request.sample2 = previous, current
        nvml.nvmlGpmMetricsGet(request)
        readings: list[Reading] = []
        refused: list[GpmMetric] = []
        for wanted, answer in zip(self._metrics, self._answers, strict=True):
            if answer.nvmlReturn == pynvml.NVML_SUCCESS and not math.isnan(answer.value):
                readings += wanted.readings(answer.value, self._prefix)
            elif answer.nvmlReturn in UNSUPPORTED:
                refused.append(wanted)
        if refused:
            where = "" if self._gpu_instance is None else f" (GPU instance {self._gpu_instance})"
            log.info("NVML GPM metric %s is not supported on GPU %d%s; its series are left out",
                     ", ".join(m.description for m in refused), self._gpu, where)
            self._metrics = tuple(m for m in self._metrics if m not in refused)
            self._request = None
        return readings

    def measures(self, metric: GpuMetric) -> bool:
        """Whether this reader asks for `metric` and the board has not refused it."""
        return any(wanted.metric is metric for wanted in self._metrics)

    def free(self, nvml: Nvml) -> None:
        """Release the samples; the driver may already be gone, which leaves nothing to release."""
        samples, self._samples, self._primed = self._samples, [], False
        for sample in samples:
            try:
                nvml.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError:
                pass

    def _build_request(self) -> pynvml.c_nvmlGpmMetricsGet_t:
        """NVML's own request structure, built once: the metric ids stay, the two samples change each time."""
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._metrics)
        for index, wanted in enumerate(self._metrics):
            request.metrics[index].metricId = wanted.metric_id
        self._request = request
        self._answers = [request.metrics[index] for index in range(len(self._metrics))]
        return request
