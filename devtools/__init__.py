"""What the tests, the benchmarks and `python -m gpufleet.devtools` share, in one importable place.

The harness starts the real programs (Prometheus, Alertmanager, VictoriaMetrics,
vmagent, vmalert, node_exporter, and gpufleet's own exporter and simulator) on
127.0.0.1, waits for them within bounds, queries them and stops them: `programs`,
`processes`, `net`, `waiting`, `prom`. The builders of everything generated from the
code (the golden exposition, the reference pages, the benchmark page) live beside it
and run from a checkout: `python -m gpufleet.devtools generate`.
"""
