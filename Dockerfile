# syntax=docker/dockerfile:1
# The AgentRun operator image. The same image is the in-pod reporter: the Jobs the operator creates
# run `agentrun reporter report|fingerprint` from it (AGENTS_REPORTER_IMAGE defaults to this image).
#
#   docker build -t ghcr.io/proompteng/agentrun-operator:0.1.0 .
#   docker run --rm ghcr.io/proompteng/agentrun-operator:0.1.0 --version
#
# Base: Python 3.11 (the version the tests run on), Debian bookworm slim, pinned by tag AND by the
# digest of its multi-architecture index. Update both together (docs/operations.md#image).
# Where no registry answers, `make image` passes --build-arg PYTHON_IMAGE=agentrun-local/python:3.11-bookworm,
# a base made from Debian packages (docs/operations.md#make-image); the build is otherwise the same.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# -- stage 1: build the wheel, then wheels of every dependency (no compilers in the final image) --
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && python -m pip wheel --wheel-dir /wheels /dist/*.whl

# -- stage 2: install the wheels into a virtualenv, offline; run as a non-root numeric user -------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="agentrun-operator" \
      org.opencontainers.image.description="Kubernetes operator (kopf) running AgentRun workflows with looping steps; also the in-pod reporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/proompteng/agentrun-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.14-slim-bookworm"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/agentrun \
    PATH=/opt/agentrun/bin:$PATH \
    USER=agentrun
COPY --from=build /wheels /tmp/wheels
RUN python -m venv /opt/agentrun \
 && /opt/agentrun/bin/pip install --no-index --find-links /tmp/wheels agentrun-operator \
 && rm -rf /tmp/wheels \
 && groupadd --system --gid 10001 agentrun \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin agentrun \
 && agentrun --version
USER 10001:10001
WORKDIR /tmp
# 8080: kopf's /healthz (`--liveness-port`); 9102: Prometheus /metrics (`--metrics-port`).
EXPOSE 8080 9102
# Probe story: health is checked by Kubernetes, not by Docker. The chart runs the operator with
# `--liveness-port 8080` and points its liveness and readiness probes at GET /healthz; as the
# reporter sidecar the image serves no port at all, so an image-level check would be wrong there.
HEALTHCHECK NONE
ENTRYPOINT ["agentrun"]
CMD ["operator"]
