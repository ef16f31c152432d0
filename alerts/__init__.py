"""Prometheus recording and alerting rules generated as code (the alert rules issue fills this in)."""
