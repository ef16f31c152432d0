"""The end-to-end scenario: one fault of every kind the simulator knows on the sixteen-node fleet
(`layouts.SIXTEEN_NODES`), and the alerts each must fire, and where they must reach. Shared by the end-to-end
test of gpufleet's own collectors and the one beside node_exporter."""

from __future__ import annotations

from dataclasses import dataclass

from layouts import node

FAULTS_AT = 60  # Simulated (and, at speed 1, wall-clock) seconds of healthy fleet first.
HANG_AT = 70  # Simulated seconds: node 16's driver hangs, once its lost GPU's XID reached NVML's events.
RESTART_AT = 95  # Simulated seconds: node 1's exporter restarts, its GPU 1 held at a reset.
REPAIR_AT = 120  # The repairs start.
SWITCH_AT = 150  # A leaf switch goes down, once the repairs are done, and is back before the drills.
# A reboot of 20 seconds is 2.7 production minutes: shorter than NodeExporterDown's `for`, as a planned reboot.
REBOOT_SECONDS = 20


@dataclass(frozen=True)
class Expected:
    alertname: str
    instance: str | None  # None: an alert about a whole cluster.
    labels: tuple[tuple[str, str], ...] = ()
    receiver: str | None = None  # None: fires in Prometheus but reaches nobody (info, or inhibited).
    required: bool = True  # False: may fire on the way to the real alert (a flap starts with one link-down).

    def matches(self, labels: dict[str, str]) -> bool:
        return (labels.get("alertname") == self.alertname and labels.get("instance") == self.instance
                and all(labels.get(k) == v for k, v in self.labels))


def expect(alertname: str, number: int, receiver: str | None, required: bool = True, **labels: str) -> Expected:
    return Expected(alertname, node(number), tuple(sorted(labels.items())), receiver, required)


# The layout given to the simulator (layouts.SIXTEEN_NODES): slurm 944279 on nodes 1, 2, 3, 6, 8, 11, 13, 14;
# a Kubernetes job on 4, 9, 12, 16; slurm 432958 on 10 and 15; nodes 5 and 7 idle.
SCENARIO: list[tuple[dict, list[Expected]]] = [
    # A GPU that needs its node out of service opens a ticket from the recovery action the exporter holds for it,
    # and its node, which runs a job, pages once for all of its repairs (GpuRepairUrgent); the XID and ECC events
    # themselves reach nobody.
    ({"kind": "xid", "node": node(1), "gpu": 0, "xid": 79},
     [expect("GpuNeedsReboot", 1, "ticket", gpu="0"), expect("GpuRepairUrgent", 1, "pager"),
      expect("GpuXidCritical", 1, None, gpu="0", xid="79")]),
    ({"kind": "ecc_dbe", "node": node(1), "gpu": 1},
     [expect("GpuNeedsReset", 1, "ticket", gpu="1"), expect("GpuEccUncorrectable", 1, None, gpu="1"),
      expect("GpuXidCritical", 1, None, gpu="1", xid="48")]),
    ({"kind": "xid", "node": node(2), "gpu": 4, "xid": 13},
     [expect("GpuXidApplication", 2, None, gpu="4", xid="13")]),
    # A contained memory error: one ticket, for the reset at the node's next drain, which holds back its XID's
    # (reaching the ticket receiver only if the XID is told a collection before the count) and its row remap's.
    ({"kind": "ecc_contained", "node": node(2), "gpu": 5},
     [expect("GpuNeedsResetAtDrain", 2, "ticket", gpu="5"), expect("GpuEccUncorrectable", 2, None, gpu="5"),
      expect("GpuXidWarning", 2, "ticket", required=False, gpu="5", xid="94"),
      expect("GpuRowRemapPending", 2, None, gpu="5")]),
    ({"kind": "row_remap_pending", "node": node(2), "gpu": 2},
     [expect("GpuRowRemapPending", 2, "ticket", gpu="2")]),
    ({"kind": "pcie_replay_storm", "node": node(2), "gpu": 3},
     [expect("GpuPcieReplaysHigh", 2, "ticket", gpu="3")]),
    ({"kind": "row_remap_failure", "node": node(3), "gpu": 0},
     [expect("GpuNeedsReplacement", 3, "ticket", gpu="0"), expect("GpuXidCritical", 3, None, gpu="0", xid="64")]),
    ({"kind": "thermal_slowdown", "node": node(6), "gpu": 1},
     [expect("GpuHardwareSlowdown", 6, "ticket", gpu="1", reason="hw_thermal_slowdown"),
      expect("GpuThermalMarginLow", 6, "ticket", gpu="1"),
      # One GPU of eight at 60 % clock brings the node's mean clock 5 % below its peers': past the edge, unless
      # the node's other boards clock fast.
      expect("NodeStraggler", 6, "ticket", required=False)]),
    ({"kind": "nvlink_down", "node": node(6), "gpu": 2, "link": 3},
     [expect("GpuNvlinkDown", 6, "pager", gpu="2", link="3")]),
    # A non-fatal SXid every 10 s (80 production seconds): three within the hour are a ticket.
    ({"kind": "sxid_nonfatal", "node": node(6), "rate": 0.1},
     [expect("NodeNvswitchErrorsRepeated", 6, "ticket", sxid="20001")]),
    ({"kind": "power_brake", "node": node(8), "gpu": 0},
     [expect("GpuHardwareSlowdown", 8, "ticket", gpu="0", reason="hw_power_brake_slowdown"),
      expect("GpuHardwareSlowdown", 8, "ticket", gpu="0", reason="hw_slowdown"),
      # One GPU at half clock and power: the node's mean 6 % below its peers', a straggler, though the resets of
      # its board may leave its signals too few windows to be judged in.
      expect("NodeStraggler", 8, "ticket", required=False)]),
    ({"kind": "nvlink_crc", "node": node(8), "gpu": 1, "link": 4},
     [expect("GpuNvlinkCrcErrors", 8, "ticket", gpu="1", link="4")]),
    # Its first NVSwitch logs a fatal SXid: every GPU of the board is held at a reset, a ticket each, and the node,
    # which runs a job, pages once for them; the SXid is a ticket. GPU 3's own reset ends nothing; the board's reset
    # at REPAIR_AT ends them all (REPAIRED). Each GPU is off the bus while it resets: "lost" may go pending.
    ({"kind": "sxid_fatal", "node": node(8)},
     [*(expect("GpuNeedsReset", 8, "ticket", gpu=str(gpu)) for gpu in range(8)),
      expect("GpuRepairUrgent", 8, "pager"), expect("NodeNvswitchFatalError", 8, "ticket")]),
    ({"kind": "gpu_reset", "node": node(8), "gpu": 3, "start": f"{RESTART_AT}s"},
     [expect("GpuLost", 8, None, required=False, gpu="3")]),
    ({"kind": "board_reset", "node": node(8), "start": f"{REPAIR_AT}s"},
     [*(expect("GpuLost", 8, None, required=False, gpu=str(gpu)) for gpu in range(8))]),
    # A GPU the NVSwitch fabric manager never finishes registering pages; a fabric at limited capacity tickets.
    ({"kind": "fabric_not_ready", "node": node(9), "gpu": 6},
     [expect("GpuFabricNotReady", 9, "pager", gpu="6")]),
    ({"kind": "fabric_degraded", "node": node(14), "gpu": 2},
     [expect("GpuFabricDegraded", 14, "ticket", gpu="2")]),
    ({"kind": "nic_saturation", "node": node(11), "port": "mlx5_1/1", "direction": "tx"},
     [expect("NicSaturatedTrainingJob", 11, "ticket", device="mlx5_1", direction="transmit", job_id="944279"),
      # Not the plain ticket: it stands aside while the latest utilisation meets the job's ticket's condition.
      # It may go pending where a dip of the 5-minute rate below 95% lets it, and must reach no one.
      expect("NicSaturated", 11, None, required=False, device="mlx5_1", direction="transmit")]),
    ({"kind": "ib_congestion", "node": node(13), "port": "mlx5_2/1"},
     [expect("NicInfinibandCongested", 13, "ticket", device="mlx5_2"),
      # Its port waits far more than its job's median node's: its collectives hold the job back.
      expect("NodeStraggler", 13, "ticket", signal="infiniband_xmit_wait", job_id="944279")]),
    # Drift, each a ticket. Node 14 reboots into an older driver than the fleet's (10 s: 80 production seconds,
    # less than NodeExporterDown's `for`): its job's nodes and the H100 fleet then run two versions.
    ({"kind": "driver_mismatch", "node": node(14), "duration": "10s"},
     [Expected("JobVersionsMixed", None, (("component", "driver"), ("job_id", "944279")), "ticket"),
      Expected("NodeVersionsMixed", None, (("component", "driver"),), "ticket"),
      expect("NodeExporterDown", 14, None, required=False)]),
    ({"kind": "power_capped", "node": node(12), "gpu": 3},
     # A Kubernetes job's node, compared with its model's busy nodes on its SM clock: its lower power is no straggler.
     [expect("GpuPowerLimitBelowDefault", 12, "ticket", gpu="3")]),
    ({"kind": "ecc_disabled", "node": node(2), "gpu": 6}, [expect("GpuEccDisabled", 2, "ticket", gpu="6")]),
    # Soft lockups every 10 s (80 production seconds) from node 9's kernel: a ticket once three are logged.
    ({"kind": "kernel_events", "node": node(9), "event": "soft_lockup", "rate": 0.1},
     [expect("NodeKernelEventsRepeated", 9, "ticket", event="soft_lockup")]),
    # Node 2's NFS server stops answering it alone: a ticket of its own, no outage's page.
    ({"kind": "kernel_events", "node": node(2), "event": "storage_timeout", "rate": 0.1},
     [expect("NodeKernelEventsRepeated", 2, "ticket", event="storage_timeout")]),
    # A GPU's PCIe link goes bad: a completion timeout in its AER counts, then corrections at 1 a second (60 a
    # minute, past the limit of 8). Node 13 pages for nothing, so neither ticket is held back.
    ({"kind": "pcie_aer", "node": node(13), "gpu": 1},
     [expect("NodePcieUncorrectableErrors", 13, "ticket", kind="gpu", type="nonfatal"),
      # Its `for` (75 s here) and the group's interval (37.5 s) may outlast the run.
      expect("NodePcieCorrectableErrorsHigh", 13, "ticket", required=False, kind="gpu")]),
    ({"kind": "persistence_off", "node": node(13), "gpu": 5},
     [expect("GpuModeUnlikePeers", 13, "ticket", gpu="5", mode="persistence")]),
    ({"kind": "symbol_errors", "node": node(14), "port": "mlx5_3/1"},
     [expect("NicInfinibandSymbolErrors", 14, "ticket", device="mlx5_3")]),
    ({"kind": "straggler", "node": node(4)},
     # The simulator's pods have no names (no kubelet answers), so no job id: the job's nodes are compared as busy
     # nodes of one GPU model, on their SM clock.
     [expect("NodeStraggler", 4, "ticket", signal="sm_clock", peers="model")]),
    # Slurm job 432958 hangs: both its nodes spin in a collective (its straggler tests are the promtool tests'). Its
    # node 15 lost a GPU, whose page is the incident until the reboot repairs it: the job pages after that.
    ({"kind": "job_hang", "node": node(10)}, [Expected("JobHung", None, (("job_id", "432958"),), "pager")]),
    ({"kind": "ib_link_down", "node": node(9), "port": "mlx5_4/1"},
     [expect("NicInfinibandPortDown", 9, "pager", device="mlx5_4")]),  # No link-down ticket beside the page.
    # Down for 6 s of every 12 (48 production seconds): well inside "port down"'s 15 s `for` on a busy machine,
    # where a flap down for 10 s of 20 paged once in vmalert.
    ({"kind": "ib_link_flap", "node": node(12), "port": "mlx5_5/1", "period": "12s"},
     [expect("NicInfinibandLinkFlapping", 12, "pager", device="mlx5_5"),
      # The link-down warning waits for the link to stay up: it may go pending between downs, reaching no one.
      expect("NicInfinibandLinkDowned", 12, None, required=False, device="mlx5_5"),
      # Down half of the time, so "port down" may go pending; its 2m `for` outlasts each 6 s down.
      expect("NicInfinibandPortDown", 12, None, required=False, device="mlx5_5")]),
    # A ticket, on a node of its own: on node 16 its lost GPU's page would hold every ticket of the node back.
    ({"kind": "ib_rate_degraded", "node": node(7), "port": "mlx5_6/1"},
     [expect("NicInfinibandRateDegraded", 7, "ticket", device="mlx5_6")]),
    # Node 16's GPU 5 falls off the bus for good, and its driver hangs at HANG_AT (XID 119 in its kernel log only):
    # tickets for the hang and for GPU 0's reset from the XID beside GPU 5's, and the node's one page, held through
    # them. The reboot at REPAIR_AT ends the hang and its two tickets; GPU 5, still off the bus, keeps its own, and
    # the page stays.
    ({"kind": "gpu_dead", "node": node(16), "gpu": 5},
     [expect("GpuNeedsReboot", 16, "ticket", gpu="5"), expect("GpuRepairUrgent", 16, "pager"),
      expect("GpuLost", 16, None, required=False, gpu="5"),
      expect("GpuXidCritical", 16, None, gpu="5", xid="79")]),
    ({"kind": "driver_hang", "node": node(16), "start": f"{HANG_AT}s"},
     [expect("GpuDriverUnresponsive", 16, "ticket"), expect("GpuNeedsReset", 16, "ticket", gpu="0"),
      expect("GpuXidCritical", 16, None, required=False, gpu="0", xid="119")]),
    ({"kind": "node_reboot", "node": node(16), "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("NodeExporterDown", 16, None, required=False)]),
    ({"kind": "gpu_lost", "node": node(15), "gpu": 5},
     # One page, for the node's job: the reboot the GPU needs is its ticket, and the lost GPU's alert stands aside
     # for it (it may go pending before the reboot's XID is counted).
     [expect("GpuNeedsReboot", 15, "ticket", gpu="5"), expect("GpuRepairUrgent", 15, "pager"),
      expect("GpuLost", 15, None, required=False, gpu="5"),
      # The GPU collector fails while a board is lost, or its driver does not answer (node 16): the page for the
      # lost GPU explains it, and the collector's tickets stand aside in the rules.
      expect("GpuXidCritical", 15, None, gpu="5", xid="79")]),
    ({"kind": "exporter_down", "node": node(5)}, [expect("NodeExporterDown", 5, "pager")]),
    # 24 production seconds between exporter processes on a busy node: "exporter down" may go pending, and
    # nothing reaches anyone. (An XID raised while no exporter runs is lost, so it is a node with none.)
    ({"kind": "exporter_restart", "node": node(11), "duration": "3s"},
     [expect("NodeExporterDown", 11, None, required=False)]),
    # Node 1's exporter restarts while its GPU 1 is held at a reset: the page must stay open through it.
    ({"kind": "exporter_restart", "node": node(1), "start": f"{RESTART_AT}s", "duration": "3s"},
     [expect("NodeExporterDown", 1, None, required=False)]),
    # The repairs: each ends its GPU's page, and nothing else (node 1's GPU 0 still needs its reboot).
    # Off the bus while it resets (40 production seconds): "lost" may go pending, and reach no one.
    ({"kind": "gpu_reset", "node": node(1), "gpu": 1, "start": f"{REPAIR_AT}s"},
     [expect("GpuLost", 1, None, required=False, gpu="1")]),
    ({"kind": "node_reboot", "node": node(15), "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("NodeExporterDown", 15, None, required=False)]),
    ({"kind": "gpu_replace", "node": node(3), "gpu": 0, "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("NodeExporterDown", 3, None, required=False)]),
    # A GPU taken out of an idle node on purpose, during a reboot: an inventory ticket, and no page.
    ({"kind": "gpu_removed", "node": node(7), "gpu": 3, "start": f"{REPAIR_AT}s", "duration": f"{REBOOT_SECONDS}s"},
     [expect("GpuCountDropped", 7, "ticket"), expect("NodeExporterDown", 7, None, required=False)]),
    # The leaf switches of one rail go down for 30 seconds (four production minutes), taking that link of all
    # sixteen nodes: one page naming the leaf and the rail, and none for the nodes, whose own alerts it holds
    # back.
    ({"kind": "switch_down", "leaf": "su1", "port": "mlx5_7/1", "start": f"{SWITCH_AT}s", "duration": "30s"},
     [Expected("FabricLeafDown", None, (("device", "mlx5_7"), ("leaf", "su1")), "pager"),
      *(expect("NicInfinibandPortDown", number, None, required=False, device="mlx5_7") for number in range(1, 17)),
      # Each link did go down: its link-down ticket may show, and reaches nobody. The leaf's page holds it back
      # while it fires, and in the rule for the link-downs' window after, as the port's own down page does. On a
      # busy machine a scrape can count the link-down before it reads the port down (beside node_exporter, which
      # reads the simulator's files as they are written one by one), and the ticket goes pending for a moment. Node 5,
      # whose gpufleet exporter is down, shows its link going down and back beside node_exporter, though not as
      # down: gpufleet's word that the port was ever ACTIVE is gone; its NodeExporterDown page holds it back.
      *(expect("NicInfinibandLinkDowned", number, None, required=False, device="mlx5_7") for number in range(1, 17))]),
]
# Each repair, the alert it must end and when (simulated seconds): held until then, across the restart. A new
# board ends its old UUID's series rather than setting it to 0, and VictoriaMetrics, without staleness markers,
# keeps a vanished series for LOOKBACK: vmalert sees that one end so much later.
REPAIRED = [(expect("GpuNeedsReset", 1, "ticket", gpu="1"), REPAIR_AT + 5, False),
            *((expect("GpuNeedsReset", 8, "ticket", gpu=str(gpu)), REPAIR_AT + 5, False) for gpu in range(8)),
            (expect("NodeNvswitchFatalError", 8, "ticket"), REPAIR_AT + 5, False),
            (expect("GpuNeedsReboot", 15, "ticket", gpu="5"), REPAIR_AT + REBOOT_SECONDS, False),
            (expect("GpuNeedsReplacement", 3, "ticket", gpu="0"), REPAIR_AT + REBOOT_SECONDS, True),
            (expect("GpuDriverUnresponsive", 16, "ticket"), REPAIR_AT + REBOOT_SECONDS, False),
            (expect("GpuNeedsReset", 16, "ticket", gpu="0"), REPAIR_AT + REBOOT_SECONDS, False)]
# Still needing their repair at the end: node 1's GPU 0, never rebooted, and node 16's GPU 5, which its reboot did
# not bring back; and with them their nodes' pages.
UNREPAIRED = [expect("GpuNeedsReboot", 1, "ticket", gpu="0"), expect("GpuNeedsReboot", 16, "ticket", gpu="5"),
              expect("GpuRepairUrgent", 1, "pager"), expect("GpuRepairUrgent", 16, "pager")]
EXPECTED = [e for _, alerts in SCENARIO for e in alerts]
# The drill at the end: a vmagent shard stopped takes its nodes out of vmalert's sight.
UNSCRAPED = Expected("NodesUnscraped", None, (("cluster", "e2e"),), "pager")
