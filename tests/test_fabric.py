"""A GPU's NVSwitch fabric through the production NVML session, over the simulated library's HGX boards: the
registration state and health on /metrics, from each version of the call a driver may have."""

import logging

import pynvml
import pytest

from gpufleet.devtools.nodes import UUID0, UUID1
from gpufleet.exporter.collector.gpu import GpuCollector
from gpufleet.exporter.gpu.session import NvmlSession

from helpers import rendered, series

STATE, HEALTH = "gpufleet_gpu_fabric_state", "gpufleet_gpu_fabric_health"
BANDWIDTH = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
ROUTE = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
         << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY)


def fabric(nvml, clock) -> dict:
    collection = GpuCollector(NvmlSession(nvml, clock=clock)).collect()
    samples = rendered(collection)
    return {(name, gpu): samples.get(series(name, gpu=str(gpu), uuid=uuid))
            for name in (STATE, HEALTH) for gpu, uuid in ((0, UUID0), (1, UUID1))}


def test_a_registered_gpu_is_healthy_and_one_registering_has_no_health_yet(nvml, clock):
    nvml.gpus[1].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    assert fabric(nvml, clock) == {(STATE, 0): 3, (HEALTH, 0): 1, (STATE, 1): 2, (HEALTH, 1): None}


def test_the_drivers_summary_is_read_as_it_is_unless_the_registration_failed(nvml, clock):
    nvml.gpus[0].fabric_health_summary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
    nvml.gpus[1].fabric_health_summary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    found = fabric(nvml, clock)
    assert (found[HEALTH, 0], found[HEALTH, 1]) == (3, 2)
    nvml.gpus[1].fabric_status = pynvml.NVML_ERROR_UNKNOWN  # The summary says nothing of the registration.
    assert fabric(nvml, clock)[HEALTH, 1] == 4


@pytest.mark.parametrize(("mask", "status", "health"), [
    (0, pynvml.NVML_SUCCESS, 1),
    (BANDWIDTH, pynvml.NVML_SUCCESS, 3),
    (ROUTE | BANDWIDTH, pynvml.NVML_SUCCESS, 2),
    (0, pynvml.NVML_ERROR_UNKNOWN, 4),  # The registration completed with an error.
])
def test_a_driver_without_a_summary_has_its_health_read_from_the_flags_and_status(nvml, clock, mask, status, health):
    for board in nvml.gpus:
        board.fabric_info_version = 2
        board.fabric_health_mask, board.fabric_status = mask, status
    assert fabric(nvml, clock)[HEALTH, 0] == health


def test_a_driver_without_the_versioned_call_is_read_through_the_older_one(nvml, clock):
    for board in nvml.gpus:
        board.errors["nvmlDeviceGetGpuFabricInfoV"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    nvml.gpus[1].fabric_status = pynvml.NVML_ERROR_UNKNOWN
    assert fabric(nvml, clock) == {(STATE, 0): 3, (HEALTH, 0): 1, (STATE, 1): 3, (HEALTH, 1): 4}


def test_a_board_without_a_fabric_has_no_fabric_series_and_says_so_once(nvml, clock, caplog):
    nvml.gpus[0].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    collector = GpuCollector(NvmlSession(nvml, clock=clock))
    with caplog.at_level(logging.INFO, logger="gpufleet.exporter.gpu.session"):
        samples = rendered(collector.collect())
        collector.collect()
    assert series(STATE, gpu="0", uuid=UUID0) not in samples and samples[series(STATE, gpu="1", uuid=UUID1)] == 3
    lines = [r.getMessage() for r in caplog.records if "Fabric" in r.getMessage()]
    assert lines == ["NVML nvmlDeviceGetGpuFabricInfoV is not supported on GPU 0; its series are left out"]
