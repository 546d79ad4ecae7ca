#!/usr/bin/env bash
# The Pythons of Azure's stock images besides the main one (3.11, which runs the whole suite):
# Ubuntu 22.04 has 3.10, Ubuntu 24.04 3.12, and 3.13 is current. For each interpreter the
# machine already has (pyenv or PATH), from a fresh install of the project's wheel (built once,
# as `pip install .` would: the core, no extra, which is checked) into its own virtualenv:
# the pure tests (tracker, parser, config, records, approval rules, simulator) and the demo,
# which must print scheduled, started, completed and cancelled. rotel-based tests stay on 3.11
# (its wheel needs a shared libpython that pyenv's 3.12/3.13 builds here lack).
# The three run concurrently (the demo mostly waits on its scenario clock); each writes a log
# under .ci/venvs/ and the script prints them in order and fails if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSIONS=(${OTHER_PYTHONS:-3.10 3.12 3.13})
PURE_TESTS=(
  tests/test_tracker.py tests/test_parser.py tests/test_config.py tests/test_records.py
  tests/test_approval_rules.py tests/test_simulator.py tests/test_scenarios.py tests/test_telemetry.py
  tests/test_serving.py
)
# The main suite's pins, except hypothesis: 6.168.5 is its last release for Python 3.10.
test_pins() {
  if [ "$1" = 3.10 ]; then echo pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.168.5
  else echo pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.15; fi
}

find_python() {
  local v=$1 root candidate
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for candidate in "$root"/versions/"$v".*/bin/python"$v" "$(command -v "python$v" || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

one() {
  local v=$1 py=$2 venv=.ci/venvs/py$1
  set -e
  "$py" -m venv --clear "$venv"
  # shellcheck disable=SC2046
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" $(test_pins "$v") 2>&1 \
    | { grep -v "^WARNING: Location .* is ignored" || true; } | cut -c1-300
  # The core alone: what only gRPC and Event Hubs need stays out (pyproject.toml's extras).
  "$venv/bin/python" - <<'PY'
import importlib.metadata, sys
extra = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
               if d.metadata["Name"].lower().startswith(("grpcio", "azure-", "msal", "cryptography"))
               and d.metadata["Name"].lower() != "azure-scheduled-events-exporter")
if extra:
    sys.exit(f"pip install of the wheel (the core) installed {extra}: those belong to extras")
PY
  echo "-- python $v: $("$venv/bin/python" -V) pure tests"
  # Run from a copy-free path: the installed wheel, not src/, is what is imported.
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts="" "${PURE_TESTS[@]}" 2>&1 | tail -3
  echo "-- python $v: demo"
  "$venv/bin/scheduled-events-exporter" demo >"$venv/demo.out" 2>"$venv/demo.err"
  local missing=()
  for t in scheduled started completed cancelled; do
    grep -q "\"Transition\":\"$t\"" "$venv/demo.out" || missing+=("$t")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "python $v: the demo printed no ${missing[*]} transition" >&2
    tail -20 "$venv/demo.err" >&2
    return 1
  fi
  echo "python $v: demo printed $(grep -c '"Transition"' "$venv/demo.out") transitions" \
    "(scheduled, started, completed and cancelled among them)"
}

mkdir -p .ci/venvs
# One wheel for all three: three `pip install .` at once share build/ and collide there.
rm -rf .ci/venvs/wheel
"${PYTHON:-python3}" -m pip wheel -q --disable-pip-version-check --no-deps -w .ci/venvs/wheel . 2>&1 \
  | { grep -v "^WARNING: Location .* is ignored" || true; }
wheel=$(ls .ci/venvs/wheel/*.whl)
pids=() names=()
for v in "${VERSIONS[@]}"; do
  if ! py=$(find_python "$v"); then
    echo "notice: no Python $v on this machine; its checks are skipped"
    continue
  fi
  ( one "$v" "$py" ) >".ci/venvs/py$v.log" 2>&1 &
  pids+=($!) names+=("$v")
done
status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    cat ".ci/venvs/py${names[$i]}.log"
  else
    cat ".ci/venvs/py${names[$i]}.log"
    echo "FAILED: Python ${names[$i]}" >&2
    status=1
  fi
done
exit $status
