"""The per-node gpufleet exporter: GPU, NIC and thermal collectors behind a cached /metrics."""
