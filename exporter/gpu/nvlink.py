"""NVLink series per GPU, and per link only where a link needs a look; and what is read of each link.

An H100 has 18 NVLinks; per link, a state, four error counters and two traffic counters make 1,008
series on an 8-GPU node, more than the rest of the node together. Dashboards and capacity planning
read NVLink traffic and errors per GPU; an operator needs the link's number only to replace or
reset it. So by default each GPU gets its totals over its links, and a link gets its own series only
while it is down (`gpufleet_gpu_nvlink_up` 0) or once it has counted a data-link error
(`gpufleet_gpu_nvlink_link_errors_total`, every kind, from then on: a counter that came and went
would break `rate()`). NVLink5's physical-layer symbol errors, which a healthy link counts, do not
make a link erring on their own. `--collector.gpu.nvlink-per-link` exports every link's series, as
dcgm-exporter's per-link fields do.

A total over links must never fall unless the driver reset the counters: a link whose read failed
this cycle keeps its last value in the sum, so a failed read does not look like a counter reset.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pynvml

from gpufleet.exporter.gpu.nvml import Handle, Nvml
from gpufleet.exporter.gpu.probes import (
    COUNTER_MAX,
    NVLINK_ERRORS,
    NVLINK_RECEIVE,
    NVLINK_TRANSMIT,
    NVLINK_UP,
    Field,
    GpuMetric,
    Probe,
    Read,
    Reading,
    Tier,
    checked,
)

LINKS = GpuMetric("gpufleet_gpu_nvlink_links", "NVLinks the GPU has.")
LINKS_UP = GpuMetric("gpufleet_gpu_nvlink_links_up", "NVLinks that are active.")
ERRORS = GpuMetric("gpufleet_gpu_nvlink_errors_total", "NVLink errors over all the GPU's links, by kind.",
                   counter=True, labels=("error",))
TRANSMIT = GpuMetric("gpufleet_gpu_nvlink_transmit_bytes_total", "NVLink data transmitted over all the GPU's links.",
                     counter=True)
RECEIVE = GpuMetric("gpufleet_gpu_nvlink_receive_bytes_total", "NVLink data received over all the GPU's links.",
                    counter=True)
_TOTALS = {NVLINK_TRANSMIT: TRANSMIT, NVLINK_RECEIVE: RECEIVE}
# A healthy NVLink5 link counts symbol errors (its FEC corrects them): they alone do not make a link erring.
_ROUTINE = frozenset({"symbol"})
PER_LINK = frozenset({NVLINK_UP, NVLINK_ERRORS, NVLINK_TRANSMIT, NVLINK_RECEIVE})


class NvlinkSummary:
    """Turns one GPU's per-link readings into its totals plus the per-link series this mode keeps."""

    def __init__(self, per_link: bool = False) -> None:
        self.per_link = per_link
        # (uuid) -> (metric, label values) -> last value read: what a failed read leaves in the totals.
        self._last: dict[str, dict[tuple[GpuMetric, tuple[str, ...]], float]] = defaultdict(dict)
        self._erring: dict[str, set[str]] = defaultdict(set)  # Links that have counted an error, per GPU.

    def apply(self, uuid: str, readings: Iterable[Reading]) -> list[Reading]:
        kept: list[Reading] = []
        states: list[Reading] = []
        counters: list[Reading] = []
        for reading in readings:
            metric = reading.metric
            if metric is NVLINK_UP:
                states.append(reading)
            elif metric in PER_LINK:
                counters.append(reading)
            else:
                kept.append(reading)
        if not states and not counters:
            return kept
        last = self._last[uuid]
        erring = self._erring[uuid]
        if any(reading.value < last.get((reading.metric, reading.label_values), reading.value)
               for reading in counters):  # The driver reset the counters.
            last.clear()
            erring.clear()
        kept.append(Reading(LINKS, float(len(states))))
        kept.append(Reading(LINKS_UP, float(sum(reading.value for reading in states))))
        for metric, value, label_values in counters:
            last[(metric, label_values)] = value
            if metric is NVLINK_ERRORS and value > 0 and label_values[1] not in _ROUTINE:
                erring.add(label_values[0])
        totals: dict[tuple[GpuMetric, tuple[str, ...]], float] = {}
        for (metric, values), value in last.items():
            key = (ERRORS, values[1:]) if metric is NVLINK_ERRORS else (_TOTALS[metric], ())
            totals[key] = totals.get(key, 0.0) + value
        kept.extend(Reading(metric, value, values) for (metric, values), value in totals.items())
        if self.per_link:
            kept.extend(states)
            kept.extend(counters)
        else:
            kept.extend(reading for reading in states if reading.value == 0)
            kept.extend(reading for reading in counters
                        if reading.metric is NVLINK_ERRORS and reading.label_values[0] in erring)
        return kept


# NVLink5 (Blackwell) counts the physical layer's errors per link, in the field call with the link as scope:
# symbol errors, which its FEC corrects at a low rate on a healthy link, and errors left after it. Field ids 221
# and 219 in nvml.h and nvidia-ml-py alike. Their BER fields (220, 222) pack a mantissa and an exponent whose
# meaning the header does not state, and the FEC histogram bins (235-250) would be 16 series per link: left out.
NVLINK5_ERROR_FIELDS = (
    ("symbol", pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS),
    ("effective", pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS),
)
NVLINK_ERROR_COUNTERS = (
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)
_KIB = 1024


def _nvlink_state(link: int) -> Read:
    label = (str(link),)

    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        return [Reading(NVLINK_UP, 1.0 if state == pynvml.NVML_FEATURE_ENABLED else 0.0, label)]

    return read


def _nvlink_errors(link: int) -> Read:
    label = str(link)

    def read(nvml: Nvml, handle: Handle) -> list[Reading]:
        readings: list[Reading] = []
        for name, counter in NVLINK_ERROR_COUNTERS:
            value = nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)
            readings += checked(NVLINK_ERRORS, value, 0, COUNTER_MAX - 2, (label, name))
        return readings

    return read


def nvlink_probes(links: list[int]) -> list[Probe]:
    """Per-link state, read every collection since a link that goes down pages; and the links' data-link error
    counters, four calls a link that are only ever read as rates over minutes, with the other counters."""
    return [*(Probe(f"NVLink {link} state", _nvlink_state(link)) for link in links),
            *(Probe(f"NVLink {link} errors", _nvlink_errors(link), tier=Tier.COUNTER) for link in links)]


def nvlink_fields(links: list[int]) -> list[Field]:
    """Per-link throughput counters, and NVLink5's physical-layer error counters, read in the batched field call
    with the link as scope."""
    fields = []
    for link in links:
        fields.append(Field(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, f"NVLink {link} data transmitted",
                            NVLINK_TRANSMIT, 0, COUNTER_MAX - 2, times=_KIB, scope=link, label_values=(str(link),)))
        fields.append(Field(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, f"NVLink {link} data received",
                            NVLINK_RECEIVE, 0, COUNTER_MAX - 2, times=_KIB, scope=link, label_values=(str(link),)))
        fields += [Field(field_id, f"NVLink {error} errors (NVLink5)", NVLINK_ERRORS, 0, COUNTER_MAX - 2,
                         scope=link, label_values=(str(link), error), tier=Tier.COUNTER)
                   for error, field_id in NVLINK5_ERROR_FIELDS]
    return fields
