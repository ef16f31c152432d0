"""GPU utilisation: the share of time a kernel ran, as the driver samples it, over the whole interval between
two collections rather than the driver's last sample period."""

from __future__ import annotations

import pynvml

from gpufleet.exporter.gpu.nvml import UNSUPPORTED, Handle, Nvml
from gpufleet.exporter.gpu.probes import (
    FIELD_MEMBERS,
    MEMORY_COPY_UTILIZATION,
    UTILIZATION,
    Probe,
    Reading,
    checked,
)

_PERCENT = 100


class Utilization:
    """GPU and memory-copy utilisation; the GPU's averaged over every sample the driver took since the
    previous collection, where the driver keeps samples.

    `nvmlDeviceGetUtilizationRates` answers for the driver's last sample period only (1/6 s to 1 s):
    one reading per scrape sees a training step's short stalls as rarely as a scrape lands in one, so
    a node whose GPUs idle a tenth of every step looks as busy as its peers. The driver keeps its
    samples in a buffer; reading all those newer than the last one seen gives the mean over the whole
    interval, at the cost of one call. One per GPU: it remembers the last sample it read.
    """

    def __init__(self) -> None:
        self._last_seen = 0  # The driver's time stamp (CPU microseconds) of the newest sample read.
        self._sampled = True  # Until the board says it keeps no samples.
        self.from_gpm = False  # Set while GPM measures the same share: the samples cost the H200 milliseconds.

    def __call__(self, nvml: Nvml, handle: Handle) -> list[Reading]:
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        mean = self._sample_mean(nvml, handle) if self._sampled and not self.from_gpm else None
        # No sample since the last collection (collected faster than the driver samples): the last period's.
        busy = rates.gpu if mean is None else mean
        return checked(UTILIZATION, busy, 0, 100, per=_PERCENT) + checked(
            MEMORY_COPY_UTILIZATION, rates.memory, 0, 100, per=_PERCENT
        )

    def _sample_mean(self, nvml: Nvml, handle: Handle) -> float | None:
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                            self._last_seen)
        except pynvml.NVMLError as err:
            if err.value in UNSUPPORTED:
                self._sampled = False
                return None
            if err.value == pynvml.NVML_ERROR_NOT_FOUND:
                return None
            raise
        member = FIELD_MEMBERS.get(value_type)
        fresh = [sample for sample in samples if sample.timeStamp > self._last_seen]
        if member is None or not fresh:
            return None
        self._last_seen = max(sample.timeStamp for sample in fresh)
        values: list[float] = [getattr(sample.sampleValue, member) for sample in fresh]
        return sum(values) / len(values)


def utilization_probe() -> Probe:
    """A new `Utilization` for one GPU, as a probe: it keeps that GPU's last sample read."""
    return Probe("nvmlDeviceGetUtilizationRates", Utilization())
