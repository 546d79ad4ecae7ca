"""Azure Scheduled Events exporter: IMDS Scheduled Events as OpenTelemetry logs and metrics."""

__version__ = "0.1.0"
