"""What a PCI function is to a GPU node, by the vendor and class sysfs gives it: read by the GPU collector (the
GPUs the kernel lists, whether NVML does or not) and by the pcie collector (the links it counts errors on), so
that both take the same devices for GPUs."""

from __future__ import annotations

from gpufleet.exporter.sysfs import SysfsReader

NVIDIA_VENDOR, MELLANOX_VENDOR = "0x10de", "0x15b3"
_GPU_CLASSES = frozenset({0x0300, 0x0302})  # VGA and 3D controllers; NVSwitches (0x0680) are not GPUs.
_NVSWITCH_CLASS = 0x0680  # NVIDIA's "other bridge".
_NIC_CLASSES = frozenset({0x0207, 0x0200})  # InfiniBand and Ethernet controllers.


def device_kind(sysfs: SysfsReader, path: str) -> str | None:
    """`gpu`, `nvswitch`, `nic` (a Mellanox HCA), or None for any other function, of the function whose directory
    is `path`. Its class is read only for NVIDIA's and Mellanox's, and its lowest byte (the programming interface)
    does not count."""
    vendor = sysfs.text(f"{path}/vendor")
    if vendor not in (NVIDIA_VENDOR, MELLANOX_VENDOR):
        return None
    pci_class = sysfs.integer(f"{path}/class")
    if pci_class is None:
        return None
    base = pci_class >> 8
    if vendor == NVIDIA_VENDOR and base in _GPU_CLASSES:
        return "gpu"
    if vendor == NVIDIA_VENDOR and base == _NVSWITCH_CLASS:
        return "nvswitch"
    if vendor == MELLANOX_VENDOR and base in _NIC_CLASSES:
        return "nic"
    return None
