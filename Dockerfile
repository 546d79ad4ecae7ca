# The exporter's image: a virtualenv at a fixed path on top of a Python base image, run as a
# non-root numeric user with a read-only root (state lives on the volume). README, "Container".
#
# BASE_IMAGE is any image with python3 (3.10-3.13) and its venv module, the same in both stages
# (the virtualenv points at the base's interpreter): the official slim images (default), or
# Debian's own python3 (what the tests build here, docs/container.md). Nothing below depends on
# the CPU architecture: pip picks the platform's wheels. SEE_SHUTDOWN_TIMEOUT is 5 s here (10 s
# elsewhere): `docker stop` and `podman stop` kill after 10 s, and the whole stop must fit.
ARG BASE_IMAGE=docker.io/library/python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY config/scenarios ./config/scenarios
COPY src ./src
# Bytecode compiled once here, checked by hash rather than mtime (the root is read-only at run
# time, so nothing could be cached later); then the installers leave the virtualenv.
RUN python3 -m venv /opt/scheduled-events-exporter \
 && /opt/scheduled-events-exporter/bin/python -m pip install --no-compile . \
 && /opt/scheduled-events-exporter/bin/python -m pip uninstall -y -q pip setuptools wheel \
 && /opt/scheduled-events-exporter/bin/python -m compileall -q -j 0 \
        --invalidation-mode unchecked-hash /opt/scheduled-events-exporter/lib \
 && rm -f /opt/scheduled-events-exporter/bin/activate* /opt/scheduled-events-exporter/bin/Activate.ps1

FROM ${BASE_IMAGE}
ENV PATH=/opt/scheduled-events-exporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/nonexistent \
    SEE_STATE_DIR=/var/lib/scheduled-events-exporter \
    SEE_HEALTH_ADDR=0.0.0.0:8080 \
    SEE_SHUTDOWN_TIMEOUT=5
COPY --from=build /opt/scheduled-events-exporter /opt/scheduled-events-exporter
# uid/gid 65532 ("nonroot", as in distroless images) everywhere: here, config/k8s/, docs. A
# passwd entry without useradd, which minimal bases lack.
RUN grep -q '^nonroot:' /etc/group || echo 'nonroot:x:65532:' >> /etc/group \
 && grep -q '^nonroot:' /etc/passwd \
    || echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && mkdir -p /var/lib/scheduled-events-exporter \
 && chown 65532:65532 /var/lib/scheduled-events-exporter \
 && chmod 0700 /var/lib/scheduled-events-exporter
VOLUME ["/var/lib/scheduled-events-exporter"]
USER 65532:65532
EXPOSE 8080
# /healthz where SEE_HEALTH_ADDR puts it (`probe`: exit 0 on 200).
HEALTHCHECK --interval=30s --timeout=3s --start-period=150s \
  CMD ["scheduled-events-exporter", "probe"]
ENTRYPOINT ["scheduled-events-exporter"]
CMD ["run"]
