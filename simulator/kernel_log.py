"""A simulated node's kernel log: the messages its `kernel_events` faults wrote, which the node's kernel
collector reads through the same interface as /dev/kmsg (`exporter.kernellog`)."""

from __future__ import annotations

from gpufleet import xid

# event -> a message the kernel writes for it (gpufleet's patterns, `exporter.collector.kernel.EVENTS`, class each).
MESSAGES = {
    "soft_lockup": "watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python3:48213]",
    "hung_task": "INFO: task python3:48213 blocked for more than 122 seconds.",
    "storage_timeout": "nfs: server nfs-home not responding, still trying",
    "machine_check": "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: be00000000800400",
    "oom_kill": "Out of memory: Killed process 48213 (python3) total-vm:81234567kB, anon-rss:71234567kB",
}


# What the driver writes after an XID's code, for the codes whose text an operator knows them by.
XID_TEXT = {
    xid.FALLEN_OFF_BUS: "GPU has fallen off the bus.",
    xid.GSP_TIMEOUT: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
                     "(GSP_RM_CONTROL) (0x20800a4c 0x4).",
    xid.DOUBLE_BIT_ECC: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    xid.CONTAINED_ECC: "Contained: SM (0x1). RST: No, D-RST: No",
}


# What the nvidia-nvswitch driver writes for an SXid: its primary line (the class is the driver's judgement of
# this error, the link and text its own) and the data line of the same code that follows it.
SXIDS = {24007: "Fatal, Link 28 sourcetrack timeout error (First)", 20001: "Non-fatal, Link 12 TX Replay Error"}
NVSWITCH = "0000:05:00.0"  # The node's first NVSwitch (`node_sysfs`), which the SXid faults name.


class SimulatedKernelLog:
    """The node's messages in order; each reader starts at the end, as on /dev/kmsg."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def write(self, event: str, count: int) -> None:
        self.messages.extend([MESSAGES[event]] * count)

    def write_xid(self, pci_bus_id: str, code: int) -> None:
        """An XID as the NVIDIA driver logs it, for the GPU at NVML's `pci_bus_id` (`00000000:18:00.0`)."""
        domain, bus, device = pci_bus_id.split(".")[0].split(":")
        self.messages.append(f"NVRM: Xid (PCI:{domain[-4:]}:{bus}:{device}): {code}, pid=48213, name=python3, "
                             f"{XID_TEXT.get(code, 'Ch 00000008')}")

    def write_sxid(self, code: int, count: int) -> None:
        """SXids as the nvidia-nvswitch driver logs them, on the node's first NVSwitch."""
        for _ in range(count):
            self.messages.append(f"nvidia-nvswitch0: SXid (PCI:{NVSWITCH}): {code}, {SXIDS[code]}")
            self.messages.append(f"nvidia-nvswitch0: SXid (PCI:{NVSWITCH}): {code}, Data {{0x50610002, 0x10100030, "
                                 "0x00000000, 0x10100030, 0x00000000, 0x00000000, 0x00000000, 0x00000000}")

    def reader(self) -> SimulatedKernelLogReader:
        return SimulatedKernelLogReader(self)


class SimulatedKernelLogReader:
    def __init__(self, log: SimulatedKernelLog) -> None:
        self._log = log
        self._at: int | None = None

    def read(self) -> list[str]:
        start = len(self._log.messages) if self._at is None else self._at
        self._at = len(self._log.messages)
        return self._log.messages[start:self._at]

    def close(self) -> None:
        return None
