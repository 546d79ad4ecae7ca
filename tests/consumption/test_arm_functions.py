"""ARM refuses reference() and list*() where it must know a value before the deployment runs:
a resource's name, type, location, apiVersion and dependsOn ("Valid uses" of reference in the
Azure Resource Manager template functions documentation). Every template is walked for them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "config" / "azure").glob("*.json"))
RESTRICTED = ("name", "type", "location", "apiVersion", "dependsOn")
RUNTIME = re.compile(r"\b(reference|list[A-Z]\w*|list)\s*\(")


def resources(template: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    stack = list(template.get("resources", []))
    while stack:
        resource = stack.pop()
        if isinstance(resource, dict):
            found.append(resource)
            stack.extend(resource.get("resources", []))  # child resources
    return found


def expressions(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [e for v in value for e in expressions(v)]
    return []


def test_the_check_is_not_vacuous() -> None:
    assert TEMPLATES and all(resources(json.loads(t.read_text())) for t in TEMPLATES)
    bad = {"resources": [{"location": "[reference('x').location]", "name": "a"}]}
    assert [e for r in resources(bad) for e in expressions(r["location"]) if RUNTIME.search(e)]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_no_runtime_function_where_arm_needs_a_value_up_front(path: Path) -> None:
    template = json.loads(path.read_text())
    problems = []
    for resource in resources(template):
        for key in RESTRICTED:
            for expr in expressions(resource.get(key)):
                if expr.startswith("[") and RUNTIME.search(expr):
                    problems.append(f"{resource.get('type')} {key}: {expr}")
    assert not problems, "\n".join(problems)
