"""gpufleet: observability for GPU clusters.

The distribution installs this one package. Its subpackages are the folders at the top of the
repository (`exporter/`, `simulator/`, `alerts/`, `dashboards/`, `report/`), linked here so that
Python, mypy and editors all see one import root, `gpufleet`, without an import hook.
"""

__version__ = "0.1.0"
