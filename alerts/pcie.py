"""Tickets for the PCIe links a node's GPUs, NVSwitches and NICs work over, from the kernel's AER counts that
the exporter serves one series per link and error type (`exporter/collector/pcie.py`). A bad link shows there
before the device falls off the bus, and at the port above the device as often as at the device itself. Both
are tickets: a link that replays slows what runs over it, and one that lost a request may have failed a job,
but the node works on and the card is reseated or replaced at its next drain. The group runs every five
minutes, as a ticket can wait that long."""

from __future__ import annotations

from typing import Any

from gpufleet.alerts.config import Config
from gpufleet.alerts.drift import INTERVAL
from gpufleet.alerts.rule import alert, printf

AER = "gpufleet_pcie_aer_errors_total"
CORRECTABLE, UNCORRECTABLE = 'type="correctable"', 'type=~"nonfatal|fatal"'
_LINK = ("{{ $labels.kind }} {{ $labels.address }} of {{ $labels.instance }}"
         "{{ with $labels.slot }} (slot {{ . }}){{ end }}")


def _which_gpu(c: Config) -> str:
    """The GPU's index and UUID where the link is a GPU's: NVML names its PCI address with an eight-digit domain
    and capital letters, where sysfs has four digits and small ones."""
    query = printf(c.metric("gpufleet_gpu_info", f'{c.cluster_label}="%s",instance="%s",pci_bus_id=~"(?i)0000%s[.].*"'),
                   f"$labels.{c.cluster_label}", "$labels.instance", "$labels.address")
    return (f'{{{{ if eq $labels.kind "gpu" }}}}{{{{ with {query} | query }}}}, GPU {{{{ (index . 0).Labels.gpu }}}} '
            '({{ (index . 0).Labels.uuid }}),{{ end }}{{ end }}')


def pcie(c: Config) -> dict[str, Any]:
    at = "at the device or at the port above it{{ with $labels.bridge }} ({{ . }}){{ end }}"
    correctable = f"rate({c.metric(AER, CORRECTABLE)}[{c.d('5m')}]) * 60"
    return {"name": "gpufleet-pcie", "interval": c.d(INTERVAL), "rules": [
        # Counted since boot, so the ticket stays until the reboot of the repair, as a GPU's recovery action does;
        # an error counted before the exporter first read the link is still one.
        alert(c, "NodePcieUncorrectableErrors", f"{c.metric(AER, UNCORRECTABLE)} > 0", "warning",
              "A PCIe link of a GPU, NVSwitch or NIC counted uncorrectable errors since the node booted.",
              f"{_LINK}{_which_gpu(c)} counted {{{{ $value }}}} {{{{ $labels.type }}}} uncorrectable PCIe errors "
              f"since the node booted, {at}."),
        alert(c, "NodePcieCorrectableErrorsHigh", f"{correctable} > {c.pcie_correctable_per_minute:g}", "warning",
              "A PCIe link of a GPU, NVSwitch or NIC keeps correcting errors.",
              f"{_LINK}{_which_gpu(c)} corrects {{{{ $value | humanize }}}} PCIe errors a minute, {at}: the link "
              "replays what it sends, and slows what runs over it.", for_="10m"),
    ]}
