"""The scale of `gpufleet_gpu_fabric_health`, which the exporter writes and the rules read: NVML's health summary
(nvmlGpuFabricInfo_v3_t's 1 healthy, 2 unhealthy, 3 limited capacity) and one value of gpufleet's own."""

HEALTHY = 1
UNHEALTHY = 2
LIMITED_CAPACITY = 3
REGISTRATION_FAILED = 4  # A registration that completed with an error status, which no health summary states.

# How the reason of a GPU held for its whole board begins (`gpufleet_gpu_recovery_action_reason`): a fatal NVSwitch
# error (SXid) that only resetting every GPU and NVSwitch of the board, or a reboot, ends. The rules match it.
BOARD_RESET_REASON = "fatal SXid"
