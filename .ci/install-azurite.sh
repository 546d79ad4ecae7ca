#!/usr/bin/env bash
# Installs Azurite, Microsoft's Azure Storage emulator, into .ci/azurite/ (git-ignored) for the
# platform source's tests against a real Storage queue (tests/test_platform_queue.py: the real
# azure-storage-queue SDK against `azurite-queue` on a free loopback port).
# Idempotent: with the pinned version in place it does no network work and takes well under 1 s.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
azurite_dir="$here/azurite"
# Exact pin; bump it here (and nowhere else) on purpose. 3.37.0: the version the tests were
# written against (about 40 s and 360 MB of node_modules to install).
azurite_pin="3.37.0"
pkg="$azurite_dir/node_modules/azurite/package.json"

if [[ -f "$pkg" ]] && grep -q "\"version\": *\"$azurite_pin\"" "$pkg" \
    && [[ -x "$azurite_dir/node_modules/.bin/azurite-queue" ]]; then
  echo "azurite: $azurite_pin already installed in $azurite_dir"
  exit 0
fi
command -v npm >/dev/null || { echo "npm not found on PATH (node 20 is required)" >&2; exit 1; }
mkdir -p "$azurite_dir"
npm install --prefix "$azurite_dir" --no-audit --no-fund --no-save --loglevel=error \
  "azurite@$azurite_pin"
grep -q "\"version\": *\"$azurite_pin\"" "$pkg" \
  || { echo "npm install did not produce azurite $azurite_pin" >&2; exit 1; }
echo "azurite: $azurite_pin installed in $azurite_dir"
