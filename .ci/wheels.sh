#!/usr/bin/env bash
# The runtime dependencies resolve to binary wheels on every platform the exporter ships for:
# the container image on Arm64 as well as x86-64 (Azure has Arm64 VMs; the Dockerfile has no
# architecture-specific step, so a missing wheel would mean a compiler the image lacks), and
# Windows x64 (docs/windows.md: a missing wheel there would need Visual C++ to install), for
# the oldest and newest supported Python. pip resolves without installing (--dry-run), from
# the package index's metadata.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t deps < <(.venv/bin/python -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for target in "manylinux_2_17_aarch64 3.10" "manylinux_2_17_aarch64 3.13" \
              "manylinux_2_17_x86_64 3.10" "manylinux_2_17_x86_64 3.13" \
              "win_amd64 3.10" "win_amd64 3.13"; do
  read -r platform python <<<"$target"
  if out=$(.venv/bin/python -m pip install -q --disable-pip-version-check --dry-run \
             --ignore-installed --only-binary=:all: --platform "$platform" \
             --python-version "$python" --target "$scratch/t" "${deps[@]}" 2>&1); then
    echo "wheels: every runtime dependency has a wheel for $platform, Python $python"
  else
    echo "wheels: NOT every runtime dependency has a wheel for $platform, Python $python:" >&2
    echo "$out" | grep -v "^WARNING: Location" | tail -5 >&2
    status=1
  fi
done
exit $status
