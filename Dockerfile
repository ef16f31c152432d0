# The gpufleet image: exporter, simulator and the alert/dashboard builders behind one `gpufleet` command.
# NVML comes from the host's driver, mounted by the NVIDIA container toolkit; nothing CUDA is installed here.
FROM python:3.11.10-slim-bookworm AS gpufleet

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
# gpufleet/ links to the folders below; the links are copied as links and resolve inside /src (all but
# devtools, the harness of the tests and benches, which the package leaves out).
COPY gpufleet ./gpufleet
COPY exporter ./exporter
COPY simulator ./simulator
COPY alerts ./alerts
COPY dashboards ./dashboards
COPY report ./report
COPY remediate ./remediate
# `gpufleet deploy kubernetes` packages the routing compose's Alertmanager runs, through a link.
COPY deploy ./deploy
COPY compose/alertmanager/alertmanager.yml ./compose/alertmanager/alertmanager.yml
# The kubernetes extra (grpcio) names pods through the kubelet's pod-resources socket.
RUN pip install '.[kubernetes]' && rm -rf /src

# A fixed uid, so that host paths (a job mapping directory, a web config) can be granted to it.
# The simulator writes its file_sd targets to /var/lib/gpufleet-sim, a volume Prometheus reads; the exporter
# keeps its state in /var/lib/gpufleet-exporter, a volume of its own (a new one takes these owners).
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin gpufleet \
    && install -d -o gpufleet -g gpufleet /var/lib/gpufleet-sim /var/lib/gpufleet-exporter
USER 10001:10001
WORKDIR /

EXPOSE 19400
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:19400/healthz', timeout=4)"]
ENTRYPOINT ["gpufleet"]
CMD ["exporter"]

# `gpufleet remediate` drains and resumes nodes through the Slurm client and munge of Debian 12 (Slurm 22.05):
# its controller's version, or one within two releases of it.
FROM gpufleet AS remediate
USER root
RUN apt-get update && apt-get install -y --no-install-recommends slurm-client munge \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o gpufleet -g gpufleet /var/lib/gpufleet-remediate
USER 10001:10001
EXPOSE 19410
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:19410/healthz', timeout=4)"]
CMD ["remediate"]
