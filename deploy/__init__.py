"""How gpufleet is installed where it runs: the Kubernetes manifests, generated from the same configuration as the
rules and dashboards (`gpufleet deploy kubernetes`), beside systemd's unit in deploy/systemd/."""
