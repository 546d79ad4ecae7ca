"""``OTEL_EXPORTER_OTLP_*`` read as the OpenTelemetry specification and the Python SDK read
them (pure): per-signal variables win, the general endpoint is a base for http/protobuf, gRPC
keeps only host and port, headers are percent-encoded pairs, timeouts are seconds."""

from __future__ import annotations

import pytest

from scheduled_events_exporter.otlp_settings import (
    HeaderError,
    OtlpTarget,
    endpoint_warnings,
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
    for bad in ("novalue", "=v", "a=1,b", "a=1,A=2", "a=50%ZZ", "a=100%"):
        with pytest.raises(ValueError):
            parse_headers(bad)


def test_every_bad_header_is_named_at_once_and_no_value_ever() -> None:
    with pytest.raises(HeaderError) as caught:
        parse_headers("ok=1,x=hunter2%0D%0A,y z=hunter2,w=hunter2%Z1,ok=again")
    problems = caught.value.problems
    assert len(problems) == 4, problems
    assert ["'x'" in problems[0], "'y z'" in problems[1], "'w'" in problems[2],
            "'ok' is given twice" in problems[3]] == [True] * 4
    assert not any("hunter2" in p for p in problems)


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


@pytest.mark.parametrize(("raw", "named"), [
    ("api key=s3cr3t", "header key 'api key': expected an HTTP token"),
    ("api%20key=s3cr3t", "header key 'api key': expected an HTTP token"),
    ("x(y)=s3cr3t", "header key 'x(y)': expected an HTTP token"),
    ("x-key=s3cr3t%0D%0AX-Injected: 1", "the value of header 'x-key' holds a control"),
    ("x-key=s3cr3t%00", "the value of header 'x-key' holds a control"),
    ("x-key=s3cr3t%7F", "the value of header 'x-key' holds a control"),
    ("x-key=s3cr3t%C3%A9", "the value of header 'x-key' holds a control or non-ASCII"),
    ("ok=1,x-key=s3%09cr3t", "the value of header 'x-key'"),
])
def test_headers_follow_the_baggage_grammar_and_a_problem_names_the_key_only(
        raw: str, named: str) -> None:
    # The OTLP exporter specification: OTEL_EXPORTER_OTLP_HEADERS in the W3C Baggage
    # format (keys are tokens), percent-decoded values; a value becomes an HTTP header or gRPC
    # metadata value, which holds no control character.
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_LOGS_HEADERS": raw}, "logs")
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"OTEL_EXPORTER_OTLP_LOGS_HEADERS: {named}"), problems
    assert "s3cr3t" not in problems[0]


def test_header_values_may_hold_any_printable_ascii_once_decoded() -> None:
    assert parse_headers("authorization=Bearer%20a.b-c_d~e%2Bf%2F==,x=%22quoted%22") == (
        ("authorization", "Bearer a.b-c_d~e+f/=="), ("x", '"quoted"'))


@pytest.mark.parametrize(("endpoint", "grpc_target"), [
    ("unix:/run/otel.sock", "unix:/run/otel.sock"),
    ("unix:///run/otel.sock", "unix:///run/otel.sock"),
    ("unix-abstract:otel", "unix-abstract:otel"),
    ("dns:///collector.example:4317", "dns:///collector.example:4317"),
    ("dns:collector.example:4317", "dns:collector.example:4317"),
    ("ipv4:10.0.0.1:4317,10.0.0.2:4317", "ipv4:10.0.0.1:4317,10.0.0.2:4317"),
    ("collector.example:4317", "collector.example:4317"),
    ("http://collector.example:4317", "collector.example:4317"),
])
def test_grpc_takes_every_target_form_of_the_grpc_client(endpoint: str,
                                                         grpc_target: str) -> None:
    # The exporter specification: the endpoint SHOULD accept any form the gRPC client accepts.
    found = target(OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                   OTEL_EXPORTER_OTLP_INSECURE="true")
    assert (found.grpc_target, found.insecure) == (grpc_target, True)
    # Over http/protobuf the same text is no URL.
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, "logs")
    assert ("://" in endpoint and endpoint.startswith("http")) or problems


def test_an_empty_grpc_name_is_refused() -> None:
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "unix://"}, "logs")
    assert problems == ["OTEL_EXPORTER_OTLP_ENDPOINT='unix://': expected a name after unix: "
                        "(e.g. unix:///run/otel.sock, dns:///collector:4317)"]


def test_a_timeout_of_1000_or_more_is_named_as_milliseconds() -> None:
    # The specification's unit is milliseconds; this exporter reads seconds, as the Python
    # SDK does (OTEL_EXPORTER_OTLP_TIMEOUT=10000 would be 2.8 hours).
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "10000"}, "metrics")
    assert problems == ["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT='10000': expected a timeout in "
                        "seconds (the Python SDK's unit), from 0.001 to 600; 10000 looks like "
                        "milliseconds (the specification's unit): write 10 for 10 s"]
    _, problems = otlp_target({"OTEL_EXPORTER_OTLP_TIMEOUT": "900"}, "logs")
    assert "milliseconds" not in problems[0]


@pytest.mark.parametrize(("key", "named"), [
    ("a!b", "header key 'a!b': expected only letters, digits"),
    ("x-id-bin", "header key 'x-id-bin': a '-bin' or 'grpc-' key"),
    ("grpc-timeout", "header key 'grpc-timeout': a '-bin' or 'grpc-' key"),
])
def test_over_grpc_a_header_key_must_be_a_metadata_key(key: str, named: str) -> None:
    # gRPC refuses such a key on every call (INTERNAL, or a TypeError for "-bin"): at start
    # instead. Over HTTP the same key is a valid token.
    env = {"OTEL_EXPORTER_OTLP_HEADERS": f"{key}=s3cr3t"}
    _, problems = otlp_target({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "logs")
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"OTEL_EXPORTER_OTLP_HEADERS: {named}"), problems
    assert "s3cr3t" not in problems[0]
    assert otlp_target(env, "logs")[1] == []


@pytest.mark.parametrize(("env", "says"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "unix:///run/otel.sock", "OTEL_EXPORTER_OTLP_PROTOCOL":
      "grpc"}, "is a unix socket, and the gRPC channel uses TLS unless "
               "OTEL_EXPORTER_OTLP_INSECURE=true"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318",
      "OTEL_EXPORTER_OTLP_INSECURE": "true"},
     "OTEL_EXPORTER_OTLP_INSECURE=true has no effect on OTEL_EXPORTER_OTLP_ENDPOINT"),
])
def test_where_tls_is_decided_unexpectedly_it_is_said(env: dict[str, str], says: str) -> None:
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    warnings = endpoint_warnings(env, {"logs": protocol, "metrics": protocol})
    assert any(says in w for w in warnings), warnings
    quiet = {**env, "OTEL_EXPORTER_OTLP_INSECURE": "true"} if "unix" in str(env) else \
        {k: v for k, v in env.items() if "INSECURE" not in k}
    assert not any("TLS" in w for w in endpoint_warnings(quiet, {"logs": protocol})), quiet
