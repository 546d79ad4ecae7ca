#!/usr/bin/env bash
# The locked runtime closure (requirements/runtime.lock and the extras' layers,
# requirements/extra-*.lock: every route) resolves to binary wheels, each with a
# hash the lock lists, on every platform the exporter ships for: the container image on Arm64 as
# well as x86-64 (Azure has Arm64 VMs; the Dockerfile has no architecture-specific step, so a
# missing wheel would mean a compiler the image lacks), and Windows x64 (docs/windows.md: a
# missing wheel there would need Visual C++ to install), for every supported Python (the VMs'
# system Pythons, docs/vm.md, are 3.10 to 3.14; cp314 and cp315 wheels are the ones most likely
# to be missing). pip resolves without installing (--dry-run), from the package index's
# metadata; the 18 resolutions run concurrently (each mostly waits on the index).
set -euo pipefail
cd "$(dirname "$0")/.."

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# pip evaluates a requirement's markers for the running interpreter, not the target: keep the
# lock's entries that apply to the target (with their hashes), markers evaluated for it.
only_for() {  # only_for PLATFORM PYTHON > requirements
  .venv/bin/python - "$1" "$2" requirements/runtime.lock requirements/extra-*.lock <<'PY'
import re, sys
from packaging.requirements import Requirement
platform, python, *locks = sys.argv[1:]
windows = platform.startswith("win")
env = {"python_version": python, "python_full_version": python + ".0",
       "sys_platform": "win32" if windows else "linux",
       "platform_system": "Windows" if windows else "Linux",
       "platform_machine": "AMD64" if windows else platform.split("_", 3)[-1],
       "os_name": "nt" if windows else "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython"}
text = "\n".join(open(lock).read() for lock in locks)
for entry in re.split(r"\n(?=[A-Za-z0-9])", text):
    first, _, hashes = entry.partition(" \\")
    if not first.strip() or first.startswith("#"):
        continue
    requirement = Requirement(first.strip())
    if requirement.marker is None or requirement.marker.evaluate(env):
        requirement.marker = None
        kept = [line.strip(" \\") for line in hashes.splitlines() if "--hash=" in line]
        print(str(requirement), *kept)
PY
}
# The main interpreter and the others CI runs (whatever OTHER_PYTHONS limits a local run to).
pythons=($(printf '%s\n' 3.11 $(OTHER_PYTHONS= bash .ci/other-pythons.sh --list) | sort -uV))
targets=()
for platform in manylinux_2_17_aarch64 manylinux_2_17_x86_64 win_amd64; do
  for python in "${pythons[@]}"; do targets+=("$platform $python"); done
done
check() {  # check PLATFORM PYTHON: prints one line, exits non-zero when a wheel is missing
  local platform=$1 python=$2 out
  only_for "$platform" "$python" >"$scratch/req-$platform-$python.txt"
  if out=$(.venv/bin/python -m pip install -q --disable-pip-version-check --dry-run \
             --ignore-installed --only-binary=:all: --platform "$platform" \
             --python-version "$python" --implementation cp --target "$scratch/t-$platform-$python" \
             --no-deps --require-hashes -r "$scratch/req-$platform-$python.txt" 2>&1); then
    echo "wheels: every locked distribution has a hashed wheel for $platform, Python $python"
  else
    echo "wheels: NOT every locked distribution has a hashed wheel for $platform, Python $python:"
    echo "$out" | grep -v "^WARNING: Location" | tail -5
    return 1
  fi
}
pids=()
for i in "${!targets[@]}"; do
  # shellcheck disable=SC2086
  check ${targets[$i]} >"$scratch/out-$i" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then cat "$scratch/out-$i"; else cat "$scratch/out-$i" >&2; status=1; fi
done
exit $status
