"""The scale of `gpufleet_gpu_fabric_health`, which the exporter writes and the rules read: NVML's health summary
(nvmlGpuFabricInfo_v3_t's 1 healthy, 2 unhealthy, 3 limited capacity) and one value of gpufleet's own."""

HEALTHY = 1
UNHEALTHY = 2
LIMITED_CAPACITY = 3
REGISTRATION_FAILED = 4  # A registration that completed with an error status, which no health summary states.
