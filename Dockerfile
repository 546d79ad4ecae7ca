# Small, non-root image; runs with a read-only root filesystem (state lives on the volume).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY config/scenarios ./config/scenarios
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SEE_STATE_DIR=/var/lib/scheduled-events-exporter \
    SEE_HEALTH_ADDR=0.0.0.0:8080
COPY --from=build /install /usr/local
RUN useradd --system --uid 10001 --no-create-home exporter \
 && mkdir -p /var/lib/scheduled-events-exporter \
 && chown 10001:10001 /var/lib/scheduled-events-exporter
VOLUME ["/var/lib/scheduled-events-exporter"]
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=3s --start-period=150s \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["scheduled-events-exporter"]
CMD ["run"]
