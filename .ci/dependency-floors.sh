#!/usr/bin/env bash
# pyproject.toml states the runtime dependencies (the core's and the grpc, eventhubs and
# platform extras')
# as ranges; the main suite runs the newest (requirements/runtime.lock and
# requirements/extra-*.lock, exact and hashed: what the images and the release install). This
# installs the floor of every range at once (the oldest release pip users may get beside other
# packages) and runs against it the pure tests (as .ci/other-pythons.sh) and every test that
# touches a dependency: OpenTelemetry (SDK metric reader, log records, Prometheus names, OTLP
# messages end to end through rotel), grpcio, urllib3 (IMDS, OTLP/HTTP, the approval endpoint),
# prometheus-client (the scrape endpoint) and azure-eventhub/azure-identity (the Event Hubs sink
# against a real AMQP peer). The floors are read from pyproject.toml, so they cannot drift from
# what this checks.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.ci/venvs/floors
# Fewer examples per property test than the main run (tests/budget.py): the floors must pass
# them, the search for a counterexample is the main run's.
export SEE_HYPOTHESIS_SCALE=5
[ -x "$venv/bin/python" ] || .venv/bin/python -m venv "$venv"
# Every runtime dependency is `name>=floor[,<ceiling]`; each is pinned to its floor, and one
# without a floor fails here (an unbounded range is a floor nobody has run).
mapfile -t lowest < <(.venv/bin/python - <<'PY'
import re, sys, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]
deps = project["dependencies"] + extras["grpc"] + extras["eventhubs"] + extras["platform"]
for dep in deps:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([^,;\s]+)(,<[^,;\s]+)?", dep)
    if not m:
        sys.exit(f"pyproject.toml: {dep!r} is not name>=floor[,<ceiling]")
    print(f"{m[1]}=={m[2]}")
PY
)
[ ${#lowest[@]} -ge 10 ] || { echo "expected every runtime floor, found: ${lowest[*]}" >&2; exit 1; }
api_floor=$(printf '%s\n' "${lowest[@]}" | sed -n 's/^opentelemetry-api==//p')
# The OTLP exporters' encoder of the same release: tests/test_otlp_proto.py compares ours with it.
lowest+=("opentelemetry-exporter-otlp-proto-common==$api_floor")
echo "floors: ${lowest[*]}"
"$venv/bin/python" -m pip install -q --disable-pip-version-check ".[all]" "${lowest[@]}" \
  pytest==9.2.0 pytest-timeout==2.4.0 pytest-xdist==3.8.0 hypothesis==6.170.15 rotel==0.0.1a15 \
  pyyaml==6.0.4 python-qpid-proton==0.40.0 googleapis-common-protos==1.76.0 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }
# What runs is what was asked for: a resolver that moved a floor up would make this prove nothing.
"$venv/bin/python" - "${lowest[@]}" <<'PY'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name) != want:
        sys.exit(f"{name}: expected {want} installed, found {version(name)}")
PY
"$venv/bin/python" -m pip check --disable-pip-version-check
# src/ is not on the path (the tests are imported from the repository root), so what runs is
# the package installed above.
"$venv/bin/python" -m pytest -q -p no:cacheprovider -n 4 --dist loadfile \
  tests/test_tracker.py tests/test_parser.py tests/test_config.py tests/test_records.py \
  tests/test_approval_rules.py tests/test_simulator.py tests/test_scenarios.py \
  tests/test_serving.py \
  tests/test_otlp_proto.py tests/test_otlp.py tests/test_telemetry.py \
  tests/test_on_change_reader.py tests/test_prometheus_names.py tests/test_scrape.py \
  tests/test_pipeline_property.py tests/test_otlp_transport.py tests/test_grpc_channel.py \
  tests/test_process.py tests/test_metrics_cadence.py tests/test_prometheus_scrape.py \
  tests/test_failure_classes.py tests/test_imds_deadline.py tests/test_approval_worker.py \
  tests/test_eventhubs_sink.py
