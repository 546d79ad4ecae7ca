#!/usr/bin/env bash
# The Debian packages CI installs, pinned per Debian release: `bash .ci/debian-pins.sh [NAME...]`
# prints NAME=VERSION for each (every one without arguments), for the release this machine runs
# (/etc/debian_version: 12 bookworm, 13 trixie). .ci/run installs them when missing, and
# .ci/install-consumption-tools.sh takes prometheus's (promtool) from here. On another system
# (Ubuntu, Debian unstable, no /etc/debian_version) it prints the bare names: apt installs
# that release's own versions (GitHub's Ubuntu runner gets them from the workflow beforehand).
#
# Debian replaces a stable release's version only for a security fix or at a point release, so
# a pin can disappear from the archive; .ci/run then falls back to the current version.
# Versions as apt-cache policy showed them in each release's root (mmdebstrap bookworm/trixie).
#
#   podman, runc, mmdebstrap, catatonit, uidmap: build and run the container image
#     (tests/test_image.py; the base image is built from Debian packages, no registry needed);
#   bubblewrap: the exporter on a tiny state volume that fills up (tests/test_disk_faults.py), and
#     the package tests' roots (tests/test_os_packages.py);
#   systemd: systemd-analyze verify of the unit (tests/test_vm_walkthrough.py,
#     tests/test_os_packages.py; nothing starts it: a container's PID 1 is not systemd);
#   python3-venv: the system Python's venv, which docs/vm.md installs from;
#   rpm, rpmlint: the .rpm read, linted and installed with rpm --root (tests/test_os_packages.py);
#   prometheus: promtool and the server (.ci/install-consumption-tools.sh).
set -euo pipefail

bookworm=(
  "podman=4.3.1+ds1-8+deb12u1+b3" "runc=1.1.5+ds1-1+deb12u1" "mmdebstrap=1.3.5-7"
  "catatonit=0.1.7-1+b2" "uidmap=1:4.13+dfsg1-1+deb12u2" "bubblewrap=0.8.0-2+deb12u1"
  "systemd=252.39-1~deb12u2" "python3-venv=3.11.2-1+b1" "rpm=4.18.0+dfsg-1+deb12u1"
  "rpmlint=2.4.0+ds1-0.2" "prometheus=2.42.0+ds-5+deb12u1"
)
trixie=(
  "podman=5.4.2+ds1-2+b2" "runc=1.1.15+ds1-2+b4" "mmdebstrap=1.5.7-1+deb13u1"
  "catatonit=0.2.1-2+b14" "uidmap=1:4.17.4-2" "bubblewrap=0.12.0-1~deb13u1"
  "systemd=257.13-1~deb13u1" "python3-venv=3.13.5-1" "rpm=4.20.1+dfsg-3"
  "rpmlint=2.7.0-3" "prometheus=2.53.3+ds1-2"
)
case "$(cut -d. -f1 /etc/debian_version 2>/dev/null || true)" in
  12) pins=("${bookworm[@]}") ;;
  13) pins=("${trixie[@]}") ;;
  *) pins=("${bookworm[@]%%=*}") ;;  # names only
esac
if [ $# -eq 0 ]; then
  printf '%s\n' "${pins[@]}"
  exit 0
fi
for name in "$@"; do
  found=""
  for pin in "${pins[@]}"; do
    [ "${pin%%=*}" = "$name" ] && found=$pin
  done
  [ -n "$found" ] || { echo ".ci/debian-pins.sh: no pin for $name" >&2; exit 1; }
  echo "$found"
done
