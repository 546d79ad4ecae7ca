#!/usr/bin/env bash
# The Debian roots the package tests install the .deb into (tests/test_os_packages.py):
# Debian 12 (bookworm, Python 3.11), Debian 13 (trixie, 3.13) and Debian unstable (sid: its
# python3, and python3.14 and python3.15 beside it, standing in for Ubuntu 26.04 and the newest
# CPython). Each is a real Debian system with dpkg and apt (mmdebstrap --variant=apt: essential
# packages, apt, and python3 with python3-venv), so `apt-get install ./pkg.deb` runs the
# package's maintainer scripts as on a VM; no systemd runs in a root (the unit is checked with
# systemd-analyze verify on the host).
#
#   .ci/package-roots.sh DIR     builds DIR/bookworm, DIR/trixie, DIR/sid, all three at once
#                                (each ~80 s, mostly downloads), then writes DIR/done; and
#                                DIR/finished at its end, whatever happened
#
# .ci/run starts it in the background at its beginning, so the roots are ready when pytest
# reaches the package tests (which otherwise build them themselves, the same way, through this
# script). A root that cannot be built fails the script and writes DIR/<name>.failed with
# mmdebstrap's last lines. Needs root (mmdebstrap; CI runs as root).
#
# The release files of these suites can be a few weeks old on the mirror, past their
# Valid-Until: apt is told not to check that date (the files are still checked against the
# signed hashes, with the keys of the host's debian-archive-keyring). sid keeps only its current
# versions, so each run takes what it carries that day; each root prints its interpreter's
# version into DIR/<name>.python.
set -euo pipefail

dir=${1:?usage: .ci/package-roots.sh DIR}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$dir"
chmod 755 "$dir"  # apt downloads as _apt into the roots
rm -f "$dir"/done "$dir"/finished "$dir"/*.failed

build() {  # build NAME SUITE PACKAGES
  local name=$1 suite=$2 packages=$3 root="$dir/$1"
  rm -rf --one-file-system "$root"
  if ! mmdebstrap --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' \
       --include="$packages" \
       --customize-hook='chroot "$1" python3 -c "import sys; print(sys.version.split()[0])" > "$1/.python3-version"' \
       "$suite" "$root" "deb $MIRROR $suite main" >"$dir/$name.log" 2>&1; then
    grep -v "^I: " "$dir/$name.log" | tail -12 >"$dir/$name.failed"
    return 1
  fi
  mv "$root/.python3-version" "$dir/$name.python"
  # apt's downloaded packages are not needed: the tests install only local files.
  rm -rf "$root"/var/cache/apt/archives/*.deb
}

started=$SECONDS
pids=() names=()
for spec in "bookworm bookworm python3,python3-venv" \
            "trixie trixie python3,python3-venv" \
            "sid sid python3,python3-venv,python3.14,python3.14-venv,python3.15,python3.15-venv"; do
  # shellcheck disable=SC2086
  build $spec &
  pids+=($!) names+=("${spec%% *}")
done
status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "package roots: ${names[$i]} ready (python3 $(cat "$dir/${names[$i]}.python"))"
  else
    echo "package roots: FAILED: ${names[$i]} (mmdebstrap's last lines in $dir/${names[$i]}.failed):"
    cat "$dir/${names[$i]}.failed"
    status=1
  fi
done
echo "package roots: built in $((SECONDS - started)) s"
[ "$status" = 0 ] && touch "$dir/done"
echo "$status" >"$dir/finished"
exit $status
