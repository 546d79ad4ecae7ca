#!/usr/bin/env bash
# The locked runtime closure (requirements/runtime.lock and the extras' layers,
# requirements/extra-*.lock: every route) resolves to binary wheels, each with a
# hash the lock lists, on every platform the exporter ships for: the container image on Arm64 as
# well as x86-64 (Azure has Arm64 VMs; the Dockerfile has no architecture-specific step, so a
# missing wheel would mean a compiler the image lacks), and Windows x64 (docs/windows.md: a
# missing wheel there would need Visual C++ to install), for the oldest and newest supported
# Python. pip resolves without installing (--dry-run), from the package index's metadata.
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
status=0
for target in "manylinux_2_17_aarch64 3.10" "manylinux_2_17_aarch64 3.13" \
              "manylinux_2_17_x86_64 3.10" "manylinux_2_17_x86_64 3.13" \
              "win_amd64 3.10" "win_amd64 3.13"; do
  read -r platform python <<<"$target"
  only_for "$platform" "$python" >"$scratch/req.txt"
  if out=$(.venv/bin/python -m pip install -q --disable-pip-version-check --dry-run \
             --ignore-installed --only-binary=:all: --platform "$platform" \
             --python-version "$python" --implementation cp --target "$scratch/t" \
             --no-deps --require-hashes -r "$scratch/req.txt" 2>&1); then
    echo "wheels: every locked distribution has a hashed wheel for $platform, Python $python"
  else
    echo "wheels: NOT every locked distribution has a hashed wheel for $platform, Python $python:" >&2
    echo "$out" | grep -v "^WARNING: Location" | tail -5 >&2
    status=1
  fi
done
exit $status
