"""GPU access through NVML: the session that samples it, what it reads, and a simulated library."""
