"""`gpufleet simulate`: a fleet of simulated GPU nodes, each rendered by the exporter's own collectors.

The simulator fakes only the hardware boundary: each node has a simulated NVML
library and an in-memory sysfs tree. Everything above that (collectors,
scheduler state, exposition) is the exporter's production code, so what a
Prometheus scrapes from the simulator is what it would scrape from real nodes.
"""
