"""The Kubernetes manifests validate offline against the Kubernetes OpenAPI-derived JSON schemas
(PyPI kubernetes-validate, strict mode: unknown fields are errors), for the oldest Kubernetes
version the manifests target (the kubernetes-types pin, 1.30) and the newest the package knows.
This complements the tsc type check: the schemas also carry formats, enums and required fields."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.consumption import consumption_helpers as ch

VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
DOCS = ch.k8s_documents()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("where", "doc"), DOCS, ids=[w for w, _ in DOCS])
def test_manifest_validates(where: str, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{where} against Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_validation_is_strict() -> None:
    # Not vacuous: a misspelt field and a wrong type are rejected.
    (daemonset,) = [d for _, d in DOCS if d["kind"] == "DaemonSet"]
    misspelt = copy.deepcopy(daemonset)
    misspelt["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    wrong_type = copy.deepcopy(daemonset)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
