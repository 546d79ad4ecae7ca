# The exporter's images (README, "In a container"; docs/container.md):
#
#   runtime (the default): every route (console, OTLP over HTTP and gRPC, Event Hubs, the
#           Prometheus scrape) and the platform command (the Storage queue SDK) in a virtualenv on a base with a Python interpreter and nothing
#           else, no shell, no package manager (distroless python3-debian13, user nonroot = 65532).
#   slim:   the same base with the core alone (console, OTLP over HTTP, the Prometheus scrape):
#           no gRPC, no Azure SDK, none of their dependencies or advisories; published as the
#           -slim tag. A gRPC or Event Hubs configuration, or the platform command, is refused at
#           start in one line.
#   shell:  the default's virtualenv on the build stage's base, for approval hooks written as
#           shell command lines (SEE_APPROVE_HOOK="drain && leave"); published as the -shell tag.
#
# BUILDER_IMAGE is a Python with its venv module (Debian 13's python3 is installed when the base
# lacks it); RUNTIME_IMAGE is the same interpreter at the same path (/usr/bin/python3), so the
# virtualenv built in one runs in the other. The runtime closure is installed from
# requirements/runtime.lock (the core) and requirements/extra-*.lock (what the grpc, eventhubs
# and platform extras add) with hash checking, the build backend from requirements/build.lock.
# Nothing depends on the CPU architecture: pip takes each platform's wheels.
# VERSION, REVISION and CREATED fill the OCI labels (the release workflow passes them). VERSION
# is also the exporter's own version (setup.py checks it against RELEASE in
# src/scheduled_events_exporter/__init__.py), so the label and `version` say the same; without
# it the build has no git to ask, and both say so (`unknown`, `0.1.0+unknown`).
# Both defaults are pinned by digest (the tag stays for the reader), so two builds of one commit
# start from the same bytes; Renovate moves tag and digest together (renovate.json). A digest
# here must be the tag's multi-platform index, not one platform's manifest: the release builds
# linux/amd64 and linux/arm64 from it.
ARG BUILDER_IMAGE=docker.io/library/debian:13-slim@sha256:3a39a0592364683e6bab97937b72cad5a8fa6dcbbee90edb3bb48c7f8e94f258
ARG RUNTIME_IMAGE=gcr.io/distroless/python3-debian13:nonroot@sha256:8ee214843129f43e2ebf5e0ca9f2e4e6d8292143d1b8a6787f169b5898578884

FROM ${BUILDER_IMAGE} AS builder
SHELL ["/bin/sh", "-eu", "-c"]
# Debian's own python3 and venv, unless the base has them already (the tests' base does). The
# versions are the Debian release's, which is what the runtime image ships too.
# hadolint ignore=DL3008
RUN if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
        apt-get update; \
        apt-get install -y --no-install-recommends python3 python3-venv ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi

# The core's virtualenv (what the slim image ships), built once for every target.
FROM builder AS build-core
# A private mirror of the package index, if any: the lock's hashes still decide what installs.
# Empty by default (an argument without a default makes podman warn at every build that it is
# missing), and unset when empty before pip runs, so that pip sees no PIP_INDEX_URL at all
# rather than an empty one. Declared again in the stage that adds the extras: an ARG ends with
# its stage, and without it the extras came from the public index behind a mirror.
ARG PIP_INDEX_URL=""
ARG VERSION=unknown
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
# binutils' strip, for tools/trim_venv.py; in the build stages only (the shell target starts
# from builder).
# hadolint ignore=DL3008
RUN if ! command -v strip >/dev/null; then \
        apt-get update; \
        apt-get install -y --no-install-recommends binutils; \
        rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY requirements/ ./requirements/
COPY pyproject.toml setup.py README.md LICENSE ./
COPY config/scenarios ./config/scenarios
COPY src ./src
COPY tools/trim_venv.py ./tools/
# The wheel is built by the locked backend in a throwaway virtualenv (/tmp/build, never copied
# into an image). The exporter's virtualenv is made without pip (`--without-pip`): what venv
# would seed differs by builder (pip alone on Debian 13's Python 3.13; pip and setuptools 66 on
# Debian 12's 3.11), so nothing is seeded and nothing has to be removed. The throwaway
# virtualenv's pip installs into it (`pip --python`): the core's locked closure (every file
# checked against its hash), then the wheel (its version from setup.py: VERSION when given,
# which also fills the label). tools/trim_venv.py then strips the shared objects,
# removes type stubs and ships the dependencies as bytecode only (the exporter's own code keeps
# its sources), all compiled here and checked by hash rather than mtime: the root is read-only
# at run time. image-target names the image the virtualenv is (slim here, default once the
# extras are added): a route whose extra is missing then names the image that has it rather
# than pip, which no image has (src/scheduled_events_exporter/extras.py). The state directory
# is made here, 0700 for 65532, and copied with its parent (a copy does not set the mode of a
# directory it creates).
RUN if [ -z "$PIP_INDEX_URL" ]; then unset PIP_INDEX_URL; fi \
 && if [ "$VERSION" != unknown ]; then export SCHEDULED_EVENTS_EXPORTER_VERSION="$VERSION"; fi \
 && python3 -m venv /tmp/build \
 && /tmp/build/bin/python -m pip install --require-hashes --no-deps -r requirements/build.lock \
 && /tmp/build/bin/python -m pip wheel --no-deps --no-build-isolation -w /tmp/wheel . \
 && python3 -m venv --without-pip /opt/scheduled-events-exporter \
 && /tmp/build/bin/python -m pip --python /opt/scheduled-events-exporter/bin/python \
        install --no-compile --require-hashes --no-deps -r requirements/runtime.lock \
 && /tmp/build/bin/python -m pip --python /opt/scheduled-events-exporter/bin/python \
        install --no-compile --no-deps /tmp/wheel/*.whl \
 && /tmp/build/bin/python -m pip --python /opt/scheduled-events-exporter/bin/python check \
 && /opt/scheduled-events-exporter/bin/python tools/trim_venv.py /opt/scheduled-events-exporter \
 && rm -rf /opt/scheduled-events-exporter/bin/activate* /opt/scheduled-events-exporter/bin/Activate.ps1 \
        /tmp/wheel \
 && printf 'slim\n' > /opt/scheduled-events-exporter/image-target \
 && mkdir -p /out/state/scheduled-events-exporter \
 && chmod 0700 /out/state/scheduled-events-exporter

# Every route: the grpc, eventhubs and platform extras' locked layers added to the core's
# virtualenv (a distribution two layers share, azure-identity and its closure, is listed in
# both with one pin, and installed once).
FROM build-core AS build
ARG PIP_INDEX_URL=""
RUN if [ -z "$PIP_INDEX_URL" ]; then unset PIP_INDEX_URL; fi \
 && /tmp/build/bin/python -m pip --python /opt/scheduled-events-exporter/bin/python \
        install --no-compile --require-hashes --no-deps \
        -r requirements/extra-grpc.lock -r requirements/extra-eventhubs.lock \
        -r requirements/extra-platform.lock \
 && /tmp/build/bin/python -m pip --python /opt/scheduled-events-exporter/bin/python check \
 && /opt/scheduled-events-exporter/bin/python tools/trim_venv.py /opt/scheduled-events-exporter \
 && printf 'default\n' > /opt/scheduled-events-exporter/image-target

# A shell for shell-form approval hooks: the build stage's base, user 65532 added by hand.
FROM builder AS shell
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="azure-scheduled-events-exporter (with a shell)" \
      org.opencontainers.image.description="Azure Scheduled Events as OpenTelemetry log records and metrics (OTLP, Event Hubs, console); with /bin/sh for shell-form approval hooks" \
      org.opencontainers.image.source="https://github.com/azure-scheduled-events-exporter/azure-scheduled-events-exporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="MIT"
RUN grep -q '^nonroot:' /etc/group || echo 'nonroot:x:65532:' >> /etc/group \
 && { grep -q '^nonroot:' /etc/passwd \
      || echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> /etc/passwd; }
ENV PATH=/opt/scheduled-events-exporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SEE_STATE_DIR=/var/lib/scheduled-events-exporter \
    SEE_HEALTH_ADDR=0.0.0.0:8080 \
    SEE_SHUTDOWN_TIMEOUT=5
COPY --from=build /opt/scheduled-events-exporter /opt/scheduled-events-exporter
COPY --from=build --chown=65532:65532 /out/state/ /var/lib/
VOLUME ["/var/lib/scheduled-events-exporter"]
USER 65532:65532
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=3s --start-period=150s \
  CMD ["scheduled-events-exporter", "probe"]
ENTRYPOINT ["scheduled-events-exporter"]
CMD ["run"]

# The core alone on the default's base: console, OTLP over HTTP, the Prometheus scrape.
FROM ${RUNTIME_IMAGE} AS slim
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="azure-scheduled-events-exporter (slim)" \
      org.opencontainers.image.description="Azure Scheduled Events as OpenTelemetry log records and metrics (OTLP over HTTP, console, Prometheus); without gRPC and Event Hubs" \
      org.opencontainers.image.source="https://github.com/azure-scheduled-events-exporter/azure-scheduled-events-exporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="MIT"
ENV PATH=/opt/scheduled-events-exporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SEE_STATE_DIR=/var/lib/scheduled-events-exporter \
    SEE_HEALTH_ADDR=0.0.0.0:8080 \
    SEE_SHUTDOWN_TIMEOUT=5
COPY --from=build-core /opt/scheduled-events-exporter /opt/scheduled-events-exporter
COPY --from=build-core --chown=65532:65532 /out/state/ /var/lib/
VOLUME ["/var/lib/scheduled-events-exporter"]
USER 65532:65532
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=3s --start-period=150s \
  CMD ["scheduled-events-exporter", "probe"]
ENTRYPOINT ["scheduled-events-exporter"]
CMD ["run"]

# The default: no shell, no package manager; approval hooks in exec form only.
FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="azure-scheduled-events-exporter" \
      org.opencontainers.image.description="Azure Scheduled Events as OpenTelemetry log records and metrics (OTLP, Event Hubs, console)" \
      org.opencontainers.image.source="https://github.com/azure-scheduled-events-exporter/azure-scheduled-events-exporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="MIT"
# SEE_SHUTDOWN_TIMEOUT is 5 s here (10 s elsewhere): `docker stop` and `podman stop` kill after
# 10 s, and the whole stop must fit.
ENV PATH=/opt/scheduled-events-exporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SEE_STATE_DIR=/var/lib/scheduled-events-exporter \
    SEE_HEALTH_ADDR=0.0.0.0:8080 \
    SEE_SHUTDOWN_TIMEOUT=5
COPY --from=build /opt/scheduled-events-exporter /opt/scheduled-events-exporter
COPY --from=build --chown=65532:65532 /out/state/ /var/lib/
VOLUME ["/var/lib/scheduled-events-exporter"]
USER 65532:65532
EXPOSE 8080
# /healthz where SEE_HEALTH_ADDR puts it (`probe`: exit 0 on 200; no shell, no curl needed).
HEALTHCHECK --interval=30s --timeout=3s --start-period=150s \
  CMD ["scheduled-events-exporter", "probe"]
ENTRYPOINT ["scheduled-events-exporter"]
CMD ["run"]
