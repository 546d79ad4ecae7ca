#!/usr/bin/env bash
# The two builds of this checkout the package tests install, upgrade and roll back
# (tests/test_os_packages.py), for this machine's architecture:
#
#   .ci/package-builds.sh DIR    DIR/a: tools/build-packages as it names the build;
#                                DIR/b: the same code as a later version (one more segment, so
#                                later in dpkg's and rpm's order alike); then DIR/done
#
# .ci/run starts it in the background beside the Debian roots (.ci/package-roots.sh): both are
# mostly downloads, and are done by the time pytest reaches the package tests, which wait for
# DIR/done (without SEE_PACKAGE_BUILDS they build the same way themselves). The second build
# takes the first one's downloaded wheels (DIR/cache). A failed build writes DIR/failed.
set -euo pipefail

dir=${1:?usage: .ci/package-builds.sh DIR}
cd "$(dirname "$0")/.."
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "package builds: no package for $(uname -m)" >"$dir/failed"; exit 1 ;;
esac
mkdir -p "$dir"
chmod 755 "$dir"  # bound read-only into the roots
rm -f "$dir/done" "$dir/failed"
started=$SECONDS

build() {  # build NAME [VERSION]
  if ! SCHEDULED_EVENTS_EXPORTER_VERSION=${2:-} .venv/bin/python tools/build-packages \
       "$dir/$1" --arch "$arch" --cache "$dir/cache" 2>"$dir/$1.log"; then
    { echo "build $1 failed:"; tail -20 "$dir/$1.log"; } >"$dir/failed"
    cat "$dir/failed"
    exit 1
  fi
}
# An empty SCHEDULED_EVENTS_EXPORTER_VERSION is no override (setup.py, build-packages).
build a
package=$(sed -n 's/.*exporter [^ ]*, package \([^ ]*\), in .*/\1/p' "$dir/a.log")
case "$package" in
  *+*) later="$package.1" ;;
  *) later="$package+1" ;;
esac
build b "$later"
echo "package builds: $package and $later ($arch) in $((SECONDS - started)) s"
touch "$dir/done"
