"""Grafana dashboards generated as code with grafanalib (the dashboards issue fills this in)."""
