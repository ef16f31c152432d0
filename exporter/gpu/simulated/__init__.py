"""Simulated GPUs behind the NVML Protocol: the one hardware boundary gpufleet fakes.

`board` holds what a board is and reads over time, `host` the identities and
cgroups of the machine around it, and `nvml` the pynvml-shaped library that
answers the exporter's calls from the boards.
"""
