"""`gpufleet remediate`: from Alertmanager's webhook to a drained Slurm node and back.

Alerts that carry a `remediation` label (the GPU recovery actions) drain their node through `scontrol`, so the
scheduler places no new work there; once every such alert of the node has resolved (the exporter saw the reset
or reboot done) and the site's check passes, the node is resumed. Only nodes gpufleet drained itself are ever
resumed: the drain reason says who drained a node. Dry run is the default.
"""
