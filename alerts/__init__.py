"""Prometheus alerting rules generated as code: `alerts/rules.py` -> `alerts/gpufleet-rules.yml`."""
