#!/usr/bin/env bash
# The supported Pythons besides the main one (3.11, which runs the whole suite): Ubuntu 22.04's
# 3.10, Ubuntu 24.04's 3.12, Debian 13's 3.13, Ubuntu 26.04's 3.14 and the newest, 3.15. For each,
# from a fresh install of the project's wheel (built once, as `pip install .` would: the core, no
# extra, which is checked) into its own virtualenv: the pure tests (tracker, parser, config, records, approval rules, simulator) and
# the demo, which must print scheduled, started, completed and cancelled. rotel-based tests stay
# on 3.11 (its wheel needs a shared libpython that pyenv's 3.12/3.13 builds here lack).
#
# Where each interpreter comes from: the machine's own first (pyenv, then python3.X on PATH).
# 3.14 and 3.15 are on neither pyenv nor Debian 12 here, and no package index serves CPython
# itself, so when the machine lacks them they come from Debian's unstable suite (sid): one root
# file system unpacked by mmdebstrap with python3.14 and python3.15 (and their venv modules),
# entered with bubblewrap, with the checkout bound in at its own path. Debian keeps no old
# versions in sid and this machine reaches no snapshot archive, so nothing finer than the minor
# version can be pinned: each run takes the interpreters sid carries that day, and prints the
# archive's date and the exact package versions it used. The root is built once per run, while
# the other interpreters' checks run, and deleted at the end: nothing is cached across runs.
#
# A CI run must not pass without them: as root (CI runs as root) a root that cannot be built,
# or an interpreter missing from it, fails the script with a line saying which. Without root
# (a developer's machine, which cannot run mmdebstrap), 3.14 and 3.15 are skipped with a notice
# unless the machine has them itself; OTHER_PYTHONS="3.10 3.12" limits the run to those.
# Other interpreters the machine lacks are skipped with a notice.
#
# Everything runs concurrently (the demo mostly waits on its scenario clock, the root's build on
# the network): the root's build beside the wheel's and the machine's interpreters' checks, and
# in each check the demo beside the pure tests. Each check writes a log under .ci/venvs/; the
# script prints them in order and fails if any failed. `bash .ci/other-pythons.sh --list` prints the versions it runs and nothing else
# (tests/test_packaging.py holds pyproject.toml's classifiers to them).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSIONS=(${OTHER_PYTHONS:-3.10 3.12 3.13 3.14 3.15})
# Fewer examples per property test than the main run (tests/budget.py): here the properties
# must hold on each interpreter, the search for a counterexample is the main run's.
export SEE_HYPOTHESIS_SCALE=5
# Those that Debian unstable provides when the machine has no interpreter of its own.
SID_VERSIONS=(3.14 3.15)
SID_MIRROR=${SID_MIRROR:-http://deb.debian.org/debian}
if [ "${1:-}" = --list ]; then
  echo "${VERSIONS[@]}"
  exit 0
fi
PURE_TESTS=(
  tests/test_tracker.py tests/test_parser.py tests/test_config.py tests/test_records.py
  tests/test_approval_rules.py tests/test_simulator.py tests/test_scenarios.py tests/test_telemetry.py
  tests/test_serving.py tests/test_redrive.py
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

# one VERSION PYTHON [COMMAND PREFIX...]: every command that runs the interpreter or its venv
# goes through the prefix (bwrap into the sid root for 3.14 and 3.15; none otherwise).
one() {
  local v=$1 py=$2 venv=.ci/venvs/py$1
  local -a run=("${@:3}")
  set -e
  "${run[@]}" "$py" -m venv --clear "$venv"
  # shellcheck disable=SC2046
  "${run[@]}" "$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" $(test_pins "$v") 2>&1 \
    | { grep -v "^WARNING: Location .* is ignored" || true; } | cut -c1-300
  # The core alone: what only gRPC and Event Hubs need stays out (pyproject.toml's extras).
  "${run[@]}" "$venv/bin/python" - <<'PY'
import importlib.metadata, sys
extra = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
               if d.metadata["Name"].lower().startswith(("grpcio", "azure-", "msal", "cryptography"))
               and d.metadata["Name"].lower() != "azure-scheduled-events-exporter")
if extra:
    sys.exit(f"pip install of the wheel (the core) installed {extra}: those belong to extras")
PY
  # The demo mostly waits on its 40-second scenario clock: it runs beside the pure tests.
  "${run[@]}" "$venv/bin/scheduled-events-exporter" demo >"$venv/demo.out" 2>"$venv/demo.err" &
  local demo_pid=$! tests=0 demo=0
  echo "-- python $v: $("${run[@]}" "$venv/bin/python" -V) pure tests"
  # Run from a copy-free path: the installed wheel, not src/, is what is imported.
  "${run[@]}" "$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts="" "${PURE_TESTS[@]}" \
    >"$venv/tests.out" 2>&1 || tests=$?
  tail -3 "$venv/tests.out"
  wait "$demo_pid" || demo=$?
  echo "-- python $v: demo"
  local missing=()
  for t in scheduled started completed cancelled; do
    grep -q "\"Transition\":\"$t\"" "$venv/demo.out" || missing+=("$t")
  done
  if [ "$demo" != 0 ]; then echo "python $v: the demo exited with status $demo" >&2; fi
  if [ ${#missing[@]} -gt 0 ]; then echo "python $v: the demo printed no ${missing[*]} transition" >&2; fi
  if [ "$demo" != 0 ] || [ ${#missing[@]} -gt 0 ]; then
    tail -20 "$venv/demo.err" >&2
    return 1
  fi
  echo "python $v: demo printed $(grep -c '"Transition"' "$venv/demo.out") transitions" \
    "(scheduled, started, completed and cancelled among them)"
  if [ "$tests" != 0 ]; then
    echo "python $v: the pure tests failed (pytest exit status $tests)" >&2
    return 1
  fi
}

# build_sid_root VERSION...: a fresh Debian unstable root at $sid_root with those interpreters
# and their venv modules; prints the archive's date and the package versions it took.
# --variant=extract unpacks them and what they depend on without running any maintainer script
# (seen here: 5-7 s and 95 MB; a minbase system, some 90 packages configured, took 40 s and
# 220 MB and made this script 21 s slower). Added by hand, what every Debian or Ubuntu system
# has and the checks need: the merged-/usr links (without lib64 no program finds its dynamic
# loader), dash and coreutils (the approval rules' tests look for /bin/sh and /bin/true) and
# libstdc++6 (grpcio's manylinux wheel links to it). The host's CA bundle is bound in where
# Debian's pip looks for it (sid_prefix).
build_sid_root() {
  local packages=() v
  for v in "$@"; do packages+=("python$v" "python$v-venv"); done
  echo "-- Python $*: a Debian unstable root (mmdebstrap sid, $SID_MIRROR)"
  # The archive's Release file here can be weeks old, past its Valid-Until: apt refuses it
  # without Check-Valid-Until (the files are still checked against its signed hashes). The
  # extract variant runs no customize hook and records nothing in dpkg's database: extract hooks
  # add the links and print the archive's date and each downloaded package's version.
  if ! mmdebstrap --variant=extract --aptopt='Acquire::Check-Valid-Until "false"' \
       --include="$(IFS=,; echo "${packages[*]}"),libstdc++6,dash,coreutils" \
       --extract-hook='for d in bin lib lib64 sbin; do ln -s "usr/$d" "$1/$d"; done' \
       --extract-hook='sed -n "s/^Date: /sid archive of /p" "$1"/var/lib/apt/lists/*_sid_InRelease' \
       --extract-hook='for f in "$1"/var/cache/apt/archives/*.deb; do
                         dpkg-deb --show --showformat="sid package \${Package} \${Version}\n" "$f"
                       done' \
       sid "$sid_root" "deb $SID_MIRROR sid main" >.ci/venvs/mmdebstrap.log 2>&1; then
    grep -v "^I: " .ci/venvs/mmdebstrap.log | tail -12
    echo "FAILED: the Debian unstable root for Python $* could not be built (mmdebstrap above)"
    return 1
  fi
  grep "^sid archive of " .ci/venvs/mmdebstrap.log || true
  grep -E "^sid package (python3\.[0-9]+(-venv)?|python3-pip-whl|libstdc\+\+6) " \
    .ci/venvs/mmdebstrap.log || true
}

# The command prefix that runs a program inside the sid root: the checkout at its own path,
# the host's name resolution and CA bundle (the package index may be reached through a proxy
# only this machine's bundle knows), a private /tmp, and no environment but what pip needs.
sid_prefix() {
  local ca=/etc/ssl/certs/ca-certificates.crt
  sid_run=(bwrap --bind "$sid_root" / --dev /dev --proc /proc --tmpfs /tmp
    --ro-bind /etc/resolv.conf /etc/resolv.conf --ro-bind "$ca" "$ca"
    --bind "$PWD" "$PWD" --chdir "$PWD" --die-with-parent --clearenv
    --setenv PATH /usr/bin:/bin --setenv HOME /tmp --setenv LANG C.UTF-8
    --setenv PIP_CERT "$ca" --setenv SSL_CERT_FILE "$ca")
  local name
  for name in PIP_INDEX_URL http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!name:-}" ]; then sid_run+=(--setenv "$name" "${!name}"); fi
  done
  sid_run+=(--)
}

mkdir -p .ci/venvs
rm -rf .ci/venvs/wheel .ci/venvs/*.log

status=0
local_versions=() local_pythons=() sid_versions=()
for v in "${VERSIONS[@]}"; do
  if py=$(find_python "$v"); then
    local_versions+=("$v") local_pythons+=("$py")
  elif [[ " ${SID_VERSIONS[*]} " == *" $v "* ]]; then
    sid_versions+=("$v")
  else
    echo "notice: no Python $v on this machine; its checks are skipped"
  fi
done

# The root's build (mostly downloads) starts first and runs beside everything else.
build_pid=""
if [ ${#sid_versions[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "notice: no Python ${sid_versions[*]} on this machine, and the Debian unstable root they" \
      "come from needs root (mmdebstrap): their checks are skipped (CI runs as root and runs them)"
    sid_versions=()
  elif ! command -v mmdebstrap >/dev/null || ! command -v bwrap >/dev/null; then
    echo "FAILED: no Python ${sid_versions[*]} on this machine, and no mmdebstrap or bwrap to" \
      "bring them from Debian unstable (apt-get install mmdebstrap bubblewrap; .ci/run does)" >&2
    sid_versions=()
    status=1
  else
    sid_root=$(mktemp -d "${TMPDIR:-/tmp}/see-sid-root.XXXXXX")
    chmod 755 "$sid_root"  # apt downloads as _apt into it
    # --one-file-system: never into a bind mount that a straggling bwrap still holds.
    trap 'rm -rf --one-file-system "$sid_root"' EXIT
    build_sid_root "${sid_versions[@]}" >.ci/venvs/sid-root.log 2>&1 &
    build_pid=$!
  fi
fi

# One wheel for all: several `pip install .` at once share build/ and collide there.
"${PYTHON:-python3}" -m pip wheel -q --disable-pip-version-check --no-deps -w .ci/venvs/wheel . 2>&1 \
  | { grep -v "^WARNING: Location .* is ignored" || true; }
wheel=$(ls .ci/venvs/wheel/*.whl)

versions=() pids=()
for i in "${!local_versions[@]}"; do
  ( one "${local_versions[$i]}" "${local_pythons[$i]}" ) >".ci/venvs/py${local_versions[$i]}.log" 2>&1 &
  versions+=("${local_versions[$i]}") pids+=($!)
done
if [ -n "$build_pid" ]; then
  if wait "$build_pid"; then
    sid_prefix
    for v in "${sid_versions[@]}"; do
      if [ -x "$sid_root/usr/bin/python$v" ]; then
        ( one "$v" "/usr/bin/python$v" "${sid_run[@]}" ) >".ci/venvs/py$v.log" 2>&1 &
        versions+=("$v") pids+=($!)
      else
        echo "FAILED: Python $v: no /usr/bin/python$v in the Debian unstable root" >>.ci/venvs/sid-root.log
        status=1
      fi
    done
  else
    root_failed="Python ${sid_versions[*]}: the Debian unstable root could not be built (log above)"
  fi
fi

failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${versions[$i]}")
done
if [ -n "$build_pid" ]; then cat .ci/venvs/sid-root.log; fi
for v in "${versions[@]}"; do cat ".ci/venvs/py$v.log"; done
for v in "${failed[@]}"; do echo "FAILED: Python $v" >&2; done
[ ${#failed[@]} = 0 ] || status=1
if [ -n "${root_failed:-}" ]; then echo "FAILED: $root_failed" >&2; status=1; fi
exit $status
