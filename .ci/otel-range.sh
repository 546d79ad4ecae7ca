#!/usr/bin/env bash
# The OpenTelemetry packages are a range in pyproject.toml; the main suite runs the newest
# (requirements/runtime.lock). This runs the tests that touch OpenTelemetry (SDK metric reader,
# log records, Prometheus names, OTLP messages end to end through rotel) against the oldest
# release the range admits, read from pyproject.toml so the floor and this check cannot drift.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.ci/venvs/otel-lowest
[ -x "$venv/bin/python" ] || .venv/bin/python -m venv "$venv"
# Every `name>=floor` dependency whose name starts with opentelemetry-, pinned to its floor.
mapfile -t lowest < <(.venv/bin/python - <<'PY'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for dep in deps:
    m = re.fullmatch(r"(opentelemetry-[a-z-]+)>=([^,]+),.*", dep)
    if m:
        print(f"{m[1]}=={m[2]}")
PY
)
[ ${#lowest[@]} -ge 4 ] || { echo "expected the opentelemetry floors in pyproject.toml, found: ${lowest[*]}" >&2; exit 1; }
api_floor=$(printf '%s\n' "${lowest[@]}" | sed -n 's/^opentelemetry-api==//p')
# The OTLP exporters' encoder of the same release: tests/test_otlp_proto.py compares ours with it.
lowest+=("opentelemetry-exporter-otlp-proto-common==$api_floor")
echo "lowest OpenTelemetry: ${lowest[*]}"
"$venv/bin/python" -m pip install -q --disable-pip-version-check . "${lowest[@]}" \
  pytest==9.2.0 pytest-timeout==2.4.0 pytest-xdist==3.8.0 hypothesis==6.170.15 rotel==0.0.1a15 \
  pyyaml==6.0.3 python-qpid-proton==0.40.0 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }
"$venv/bin/python" - "${lowest[@]}" <<'PY'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name) != want:
        sys.exit(f"{name}: expected {want} installed, found {version(name)}")
PY
# src/ is not on the path (the tests are imported from the repository root), so what runs is
# the package installed above.
"$venv/bin/python" -m pytest -q -p no:cacheprovider -n 4 --dist loadfile \
  tests/test_otlp_proto.py tests/test_otlp.py tests/test_telemetry.py \
  tests/test_on_change_reader.py tests/test_prometheus_names.py tests/test_scrape.py \
  tests/test_pipeline_property.py tests/test_otlp_transport.py tests/test_grpc_channel.py \
  tests/test_process.py tests/test_metrics_cadence.py tests/test_prometheus_scrape.py \
  tests/test_records.py tests/test_failure_classes.py
