"""MIG: a physical GPU split into GPU instances, each with its own memory and share of the SMs.

In MIG mode a board's memory and compute are divided among GPU instances (and each of those among
compute instances); a job runs in one of them. The physical GPU keeps its health signals (ECC, XIDs,
temperature, power, NVLink): the series here add, per GPU instance, its profile, its memory and, where
the board has GPM, what its SMs and tensor pipes did. Every series keeps the physical GPU's `gpu` and
`uuid` and adds `gpu_instance`, so a rule sums instances back to their GPU with `sum by (gpu, uuid)`.

Instances are created and destroyed without a GPU reset, so they are listed at every collection, and
an instance that is gone takes its GPM samples with it.
"""

from __future__ import annotations

import pynvml

from gpufleet.exporter.gpu.gpm import MIG_METRICS, GpmReader
from gpufleet.exporter.gpu.nvml import UNSUPPORTED, Handle, Nvml, as_text
from gpufleet.exporter.gpu.probes import MEMORY_LIMIT, GpuMetric, Reading, checked, memory_info

MIG_ENABLED = GpuMetric("gpufleet_gpu_mig_enabled", "1 when MIG mode is on.")
MIG_PENDING = GpuMetric("gpufleet_gpu_mig_pending_enabled",
                        "MIG mode after the next GPU reset, while it differs from the current one (1 on, 0 off).")
MIG_INFO = GpuMetric(
    "gpufleet_gpu_mig_info",
    "A MIG device: a compute instance of a GPU instance, with its profile and UUID; the value is always 1.",
    labels=("gpu_instance", "compute_instance", "profile", "mig_uuid"),
)
MIG_MEMORY_USED = GpuMetric("gpufleet_gpu_mig_memory_used_bytes", "Framebuffer memory in use in a MIG GPU instance.",
                            labels=("gpu_instance",))
MIG_MEMORY_TOTAL = GpuMetric("gpufleet_gpu_mig_memory_total_bytes", "Framebuffer memory of a MIG GPU instance.",
                             labels=("gpu_instance",))


def profile(name: str) -> str:
    """The profile in a MIG device's name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" is 1g.10gb), or "" without one."""
    _, marker, rest = name.rpartition(" MIG ")
    return rest.strip() if marker else ""


class MigReader:
    """One GPU's MIG mode, instances and per-instance GPM; built when the GPU opens, on boards that have MIG."""

    def __init__(self, gpu: int, gpm: bool) -> None:
        self._gpu = gpu
        self._gpm = gpm  # Whether the board does GPM (and the flags want it): then each instance is sampled.
        self._instances: dict[int, GpmReader] = {}

    def read(self, nvml: Nvml, handle: Handle) -> list[Reading]:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        enabled = current == pynvml.NVML_DEVICE_MIG_ENABLE
        readings = [Reading(MIG_ENABLED, float(enabled))]
        if pending != current:  # A change that waits for a reset: rare, so a series only while it waits.
            readings.append(Reading(MIG_PENDING, float(pending == pynvml.NVML_DEVICE_MIG_ENABLE)))
        instances: set[int] = set()
        if enabled:
            for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
                except pynvml.NVMLError as err:
                    if err.value == pynvml.NVML_ERROR_NOT_FOUND:
                        continue  # No MIG device in this slot.
                    raise
                instance = nvml.nvmlDeviceGetGpuInstanceId(device)
                readings.append(Reading(MIG_INFO, 1.0, (str(instance), str(nvml.nvmlDeviceGetComputeInstanceId(device)),
                                                        profile(as_text(nvml.nvmlDeviceGetName(device))),
                                                        as_text(nvml.nvmlDeviceGetUUID(device)))))
                if instance not in instances:
                    # Compute instances share their GPU instance's memory: counted once per GPU instance.
                    memory = memory_info(nvml, device)
                    readings += checked(MIG_MEMORY_USED, memory.used, 0, MEMORY_LIMIT, (str(instance),))
                    readings += checked(MIG_MEMORY_TOTAL, memory.total, 1, MEMORY_LIMIT, (str(instance),))
                    instances.add(instance)
        readings += self._activity(nvml, handle, instances)
        return readings

    def _activity(self, nvml: Nvml, handle: Handle, instances: set[int]) -> list[Reading]:
        """GPM per GPU instance; instances that are gone free their samples, new ones start with a first sample."""
        for gone in set(self._instances) - instances:
            self._instances.pop(gone).free(nvml)
        if not self._gpm:
            return []
        readings: list[Reading] = []
        for instance in sorted(instances):
            reader = self._instances.get(instance)
            if reader is None:
                reader = self._instances[instance] = GpmReader(self._gpu, MIG_METRICS, gpu_instance=instance)
            try:
                readings += reader.read(nvml, handle)
            except pynvml.NVMLError as err:
                if err.value not in UNSUPPORTED:
                    raise
        return readings

    def free(self, nvml: Nvml) -> None:
        for reader in self._instances.values():
            reader.free(nvml)
        self._instances.clear()
