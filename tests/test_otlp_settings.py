"""``OTEL_EXPORTER_OTLP_*`` read as the OpenTelemetry specification and the Python SDK read
them (pure): per-signal variables win, the general endpoint is a base for http/protobuf, gRPC
keeps only host and port, headers are percent-encoded pairs, timeouts are seconds."""

from __future__ import annotations

import pytest

from scheduled_events_exporter.otlp_settings import (
    OtlpTarget,
    histogram_aggregation,
    otlp_target,
    parse_headers,
    temporality,
)


def target(signal: str = "logs", **env: str) -> OtlpTarget:
    found, problems = otlp_target(env, signal)
    assert problems == [], problems
    return found


def test_defaults_are_the_sdk_defaults() -> None:
    logs = target()
    assert (logs.protocol, logs.endpoint, logs.timeout, logs.gzip, logs.headers) == (
        "http/protobuf", "http://localhost:4318/v1/logs", 10.0, False, ())
    grpc = target("metrics", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert (grpc.endpoint, grpc.grpc_target, grpc.insecure) == (
        "http://localhost:4317", "localhost:4317", True)


def test_the_general_endpoint_is_a_base_a_per_signal_one_is_the_whole_url() -> None:
    assert target(OTEL_EXPORTER_OTLP_ENDPOINT="https://c:4318/otlp/").endpoint == \
        "https://c:4318/otlp/v1/logs"
    assert target("metrics", OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318",
                  OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://m:9000/ingest").endpoint == \
        "http://m:9000/ingest"
    grpc = target(OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                  OTEL_EXPORTER_OTLP_ENDPOINT="https://collector.example:4317/ignored")
    assert (grpc.grpc_target, grpc.insecure) == ("collector.example:4317", False)


@pytest.mark.parametrize(("insecure", "expected"), [("", False), ("true", True),
                                                    ("false", False)])
def test_a_grpc_endpoint_without_scheme_follows_insecure(insecure: str,
                                                         expected: bool) -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"}
    if insecure:
        env["OTEL_EXPORTER_OTLP_INSECURE"] = insecure
    found = target(**env)
    assert (found.grpc_target, found.insecure) == ("c:4317", expected)


def test_per_signal_settings_win_over_general_ones() -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL":
           "http/protobuf", "OTEL_EXPORTER_OTLP_TIMEOUT": "3", "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT":
           "0.5", "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "b=2",
           "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    logs, metrics = target(**env), target("metrics", **env)
    assert (logs.protocol, logs.timeout, logs.headers, logs.gzip) == (
        "http/protobuf", 0.5, (("a", "1"),), True)
    assert (metrics.protocol, metrics.timeout, metrics.headers) == (
        "grpc", 3.0, (("b", "2"),))


def test_headers_are_percent_encoded_pairs_with_lower_case_keys() -> None:
    assert parse_headers("Api-Key=a%20b%3Dc , x-tenant = t1,,") == (
        ("api-key", "a b=c"), ("x-tenant", "t1"))
    for bad in ("novalue", "=v", "a=1,b"):
        with pytest.raises(ValueError):
            parse_headers(bad)


@pytest.mark.parametrize(("env", "starts"), [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': "
     "expected one of http/protobuf, grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://c:21"}, "OTEL_EXPORTER_OTLP_ENDPOINT='ftp://c:21': "
     "expected an http:// or https:// URL"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT='c:4318'"),
    ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:99999"},
     "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT='http://c:99999'"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10000"}, "OTEL_EXPORTER_OTLP_TIMEOUT='10000': expected a "
     "timeout in seconds"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "nan"}, "OTEL_EXPORTER_OTLP_TIMEOUT='nan'"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION='zstd': "
     "expected gzip or none"),
    ({"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, "OTEL_EXPORTER_OTLP_INSECURE='yes'"),
    ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/no/such.pem"}, "OTEL_EXPORTER_OTLP_CERTIFICATE="
     "'/no/such.pem': expected a readable PEM file (no such file)"),
    ({"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/no/key.pem"}, "OTEL_EXPORTER_OTLP_CLIENT_KEY: expected "
     "a readable PEM file"),
])
def test_each_wrong_value_is_one_line_naming_the_variable(env: dict[str, str],
                                                          starts: str) -> None:
    _, problems = otlp_target(env, "logs")
    assert len(problems) == 1 and problems[0].startswith(starts), problems


def test_secret_values_never_appear_in_a_problem() -> None:
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr3t,broken",
                               "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/s3cr3t/key.pem"}, "logs")
    assert len(problems) == 2 and not any("s3cr3t" in p for p in problems), problems


def test_tls_files_are_checked_only_when_asked() -> None:
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/no/such.pem"}, "logs",
                              check_files=False)
    assert problems == []


def test_histogram_aggregation_takes_the_two_values_the_sdk_names() -> None:
    name = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    assert histogram_aggregation({}) == ("explicit_bucket_histogram", [])
    assert histogram_aggregation({name: " Base2_Exponential_Bucket_Histogram "}) == (
        "base2_exponential_bucket_histogram", [])
    value, problems = histogram_aggregation({name: "exponential"})
    assert value == "explicit_bucket_histogram"
    assert problems == [f"{name}='exponential': expected explicit_bucket_histogram or "
                        "base2_exponential_bucket_histogram"]


def test_temporality_preference() -> None:
    assert temporality({}) == ("cumulative", [])
    assert temporality({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "Delta"}) == (
        "delta", [])
    value, problems = temporality({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "x"})
    assert value == "cumulative" and problems[0].endswith("expected cumulative, delta or "
                                                          "lowmemory")
