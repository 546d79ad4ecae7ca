"""Validation of the ARM templates in config/azure against Azure's published resource manager JSON
schemas (github.com/Azure/azure-resource-manager-schemas, unmodified, one file per provider and
API version the templates use; the list is in ``SCHEMA_FILES``).

The schemas are not committed here: this workplace forbids committing material copied from
other repositories, and no package registry ships them. The tests read them from
``$SEE_ARM_SCHEMA_DIR``, else ``../shared/arm-schemas`` beside the clone (where the project's
steering repository can provide them to CI), else ``tests/consumption/data/arm-schemas``
(git-ignored: a developer's local copy), and are skipped, saying so, when none is there.

Two checks: the JSON Schema itself (draft-04, with ARM expressions allowed where the schemas allow
them), and a stricter one the schemas do not express: every key inside a resource's ``properties``
must be one the schema declares, so a misspelt or invented property (which Azure would reject or
silently ignore) fails here.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

_REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILES = (
    "2019-04-01/deploymentTemplate.json",
    "common/definitions.json",
    "2022-04-01/Microsoft.Authorization.json",
    "2022-06-01/Microsoft.Insights.json",
    "2022-10-01/Microsoft.OperationalInsights.json",
    "2023-12-01/Microsoft.Insights.json",
    "2024-01-01/Microsoft.EventHub.json",
)
#: Schemas of config/azure/platform-feed.json (Event Grid, Storage), from the same repository.
#: Looked for in the same directory but not required by the others: where they are missing, only
#: that template's validation is skipped, saying which files to add.
OPTIONAL_SCHEMA_FILES = {
    "Microsoft.EventGrid": "2025-02-15/Microsoft.EventGrid.json",
    "Microsoft.Storage": "2025-01-01/Microsoft.Storage.json",
}


def _schema_dir() -> Path | None:
    candidates = [Path(p) for p in (os.environ.get("SEE_ARM_SCHEMA_DIR", ""),) if p]
    candidates += [_REPO.parent / "shared" / "arm-schemas",
                   Path(__file__).parent / "data" / "arm-schemas"]
    for candidate in candidates:
        if all((candidate / name).is_file() for name in SCHEMA_FILES):
            return candidate
    return None


SCHEMA_DIR = _schema_dir()
#: Why the schema tests cannot run here, or "" when they can.
MISSING = "" if SCHEMA_DIR is not None else (
    "Azure resource manager schemas not present: set SEE_ARM_SCHEMA_DIR to a directory "
    "holding " + ", ".join(SCHEMA_FILES) + " (from github.com/Azure/"
    "azure-resource-manager-schemas, schemas/), or put them in shared/arm-schemas beside "
    "the repository's directory or in tests/consumption/data/arm-schemas; fetched "
    "material is not committed to this repository"
)


def missing_provider_schemas(template: dict[str, Any]) -> list[str]:
    """The optional schema files a template's resource types need and the directory lacks."""
    providers = {r.get("type", "").split("/")[0] for r in template.get("resources", [])}
    return sorted(name for provider, name in OPTIONAL_SCHEMA_FILES.items()
                  if provider in providers
                  and (SCHEMA_DIR is None or not (SCHEMA_DIR / name).is_file()))


BASE_URI = "https://schema.management.azure.com/schemas/"
DEPLOYMENT_TEMPLATE = BASE_URI + "2019-04-01/deploymentTemplate.json"
_KINDS = (
    "resourceDefinitions",
    "extension_resourceDefinitions",
    "subscription_resourceDefinitions",
    "managementGroup_resourceDefinitions",
    "tenant_resourceDefinitions",
)


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One finding: where in the template, and what is wrong."""

    where: str
    message: str


@functools.cache
def _documents() -> dict[str, Any]:
    """Every stored schema by its URI (without fragment)."""
    docs: dict[str, Any] = {}
    assert SCHEMA_DIR is not None, MISSING
    for path in sorted(SCHEMA_DIR.rglob("*.json")):
        uri = BASE_URI + path.relative_to(SCHEMA_DIR).as_posix()
        docs[uri] = json.loads(path.read_text(encoding="utf-8"))
    return docs


@functools.cache
def registry() -> Registry[Any]:
    """A registry that resolves schema.management.azure.com references to the stored files only
    (an unresolvable reference raises instead of fetching)."""
    return Registry().with_resources(
        (uri, Resource.from_contents(doc, default_specification=DRAFT4))
        for uri, doc in _documents().items()
    )


def resource_definition(rtype: str, api_version: str) -> str | None:
    """URI of the schema describing ``rtype`` at ``api_version``, or None if not stored."""
    for uri, doc in _documents().items():
        for kind in _KINDS:
            for name, definition in doc.get(kind, {}).items():
                props = definition.get("properties", {})
                if rtype in props.get("type", {}).get("enum", []) and api_version in props.get(
                    "apiVersion", {}
                ).get("enum", []):
                    return f"{uri}#/{kind}/{name}"
    return None


#: Schema findings that are known defects of the generated ARM schemas, not of the templates: the
#: REST API spec declares DataFlow.streams as an extensible enum (x-ms-enum KnownDataFlowStreams,
#: modelAsString: true, azure-rest-api-specs monitor 2022-06-01 dataCollectionRules_API.json), and
#: the Event Hubs ingestion tutorial's own template uses a Custom- stream there, but the schema
#: generator closed the enum.
EXTENSIBLE_ENUM_PROBLEMS = (
    (
        "Microsoft.Insights/dataCollectionRules",
        re.compile(r"^'Custom-[A-Za-z0-9_-]+' is not one of "),
    ),
)

_PARAM = re.compile(r"parameters\('(\w+)'\)")
_FORMAT = re.compile(r"^\[format\('([^']*)'((?:,\s*(?:parameters\('\w+'\)|'[^']*'))*)\)\]$")


def leaf_name(name: str, parameters: dict[str, Any], *, whole: bool = False) -> str:
    """The resource's own name (last segment) with parameter defaults filled in: the schemas'
    name constraints describe that segment, while a template names a child resource by its whole
    path (``namespace/hub/consumer group``). Other expressions are returned unchanged."""

    def default(param: str) -> str:
        # A parameter without a default (a name the user must choose) stands for a value of
        # the length it asks for at least.
        spec = parameters.get(param, {})
        return str(spec.get("defaultValue", "")) or "x" * max(1, int(spec.get("minLength", 1)))

    def argument(arg: str) -> str:
        literal = re.fullmatch(r"'([^']*)'", arg)
        return literal[1] if literal else default(_PARAM.findall(arg)[0])

    match = _FORMAT.match(name)
    if match:
        args = [argument(a) for a in re.findall(r"parameters\('\w+'\)|'[^']*'", match[2])]
        name = re.sub(r"\{(\d+)\}", lambda m: args[int(m[1])], match[1])
    elif re.fullmatch(r"\[parameters\('\w+'\)\]", name):
        name = default(_PARAM.findall(name)[0])
    return name if whole else name.rsplit("/", 1)[-1]


def _validator(schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(schema, registry=registry())


def validate_template(template: dict[str, Any]) -> list[SchemaProblem]:
    """Every schema violation of a template: its top level against deploymentTemplate.json, each
    resource against resourceBase plus its type's definition, and undeclared property keys."""
    problems: list[SchemaProblem] = []
    top = {**template, "resources": []}
    for error in _validator({"$ref": DEPLOYMENT_TEMPLATE}).iter_errors(top):
        problems.append(SchemaProblem("/" + "/".join(map(str, error.path)), error.message))
    for i, res in enumerate(template["resources"]):
        where = f"resources[{i}] {res.get('type')}@{res.get('apiVersion')}"
        ref = resource_definition(res.get("type", ""), res.get("apiVersion", ""))
        if ref is None:
            problems.append(SchemaProblem(where, "no stored schema for this type and API version"))
            continue
        schema = {"allOf": [{"$ref": DEPLOYMENT_TEMPLATE + "#/definitions/resourceBase"},
                            {"$ref": ref}]}
        params = template.get("parameters", {})
        checked = {**res, "name": leaf_name(res.get("name", ""), params)}
        errors = list(_validator(schema).iter_errors(checked))
        if any(list(e.path)[:1] == ["name"] for e in errors):
            # A few schemas describe the whole path instead (queueServices: "^.*/default$").
            whole = {**res, "name": leaf_name(res.get("name", ""), params, whole=True)}
            errors = min(errors, list(_validator(schema).iter_errors(whole)), key=len)
        for error in errors:
            best = jsonschema.exceptions.best_match([error])
            if any(res.get("type") == rtype and rx.search(best.message)
                   for rtype, rx in EXTENSIBLE_ENUM_PROBLEMS):
                continue
            problems.append(
                SchemaProblem(f"{where} /{'/'.join(map(str, best.path))}", best.message[:300])
            )
        definition = registry().resolver().lookup(ref).contents
        props_schema = definition.get("properties", {}).get("properties")
        if props_schema is not None and "properties" in res:
            for path, key in undeclared_keys(res["properties"], props_schema, ref):
                problems.append(
                    SchemaProblem(f"{where} /properties{path}", f"undeclared key {key!r}")
                )
    return problems


def _is_expression_ref(schema: Any) -> bool:
    return isinstance(schema, dict) and str(schema.get("$ref", "")).endswith(
        "common/definitions.json#/definitions/expression"
    )


def _object_shapes(schema: Any, base: str) -> Iterator[tuple[dict[str, Any], str]]:
    """The object schemas a (possibly $ref / oneOf / allOf) schema can stand for, each with the URI
    its own references are relative to. ARM expression alternatives are skipped."""
    if not isinstance(schema, dict) or _is_expression_ref(schema):
        return
    if "$ref" in schema:
        ref = schema["$ref"]
        uri = ref if ref.startswith("http") else base.split("#")[0] + ref
        resolved = registry().resolver().lookup(uri)
        yield from _object_shapes(resolved.contents, uri)
        return
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            yield from _object_shapes(sub, base)
    if "properties" in schema or "additionalProperties" in schema:
        yield schema, base


def _matching_variants(shapes: list[tuple[dict[str, Any], str]],
                       instance: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The variants of a discriminated union (oneOf whose members fix a property to an enum,
    such as an Event Grid destination's endpointType) that the instance's values select; all of
    them when none does. Without this, a key of the selected variant's nested object would be
    looked up in the first variant that declares the same property name."""
    def selects(shape: dict[str, Any]) -> bool:
        for key, sub in shape.get("properties", {}).items():
            enum = sub.get("enum") if isinstance(sub, dict) else None
            value = instance.get(key)
            if enum and isinstance(value, str) and not value.startswith("[") and value not in enum:
                return False
        return True

    selected = [(s, b) for s, b in shapes if selects(s)]
    return selected or shapes


def undeclared_keys(instance: Any, schema: Any, base: str, path: str = "") -> Iterator[
    tuple[str, str]
]:
    """(path, key) for every key of an object that no applicable schema declares (objects whose
    schemas allow additional properties, or expressions, are not descended into)."""
    if isinstance(instance, list):
        for shape, shape_base in _items_shapes(schema, base):
            for i, item in enumerate(instance):
                yield from undeclared_keys(item, shape, shape_base, f"{path}[{i}]")
        return
    if not isinstance(instance, dict):
        return
    shapes = _matching_variants(list(_object_shapes(schema, base)), instance)
    if not shapes or any(s.get("additionalProperties") not in (None, False) for s, _ in shapes):
        return
    declared: dict[str, tuple[Any, str]] = {}
    for shape, shape_base in shapes:
        for key, sub in shape.get("properties", {}).items():
            declared.setdefault(key, (sub, shape_base))
    for key, value in instance.items():
        if key not in declared:
            yield path, key
        else:
            sub, sub_base = declared[key]
            yield from undeclared_keys(value, sub, sub_base, f"{path}/{key}")


def _items_shapes(schema: Any, base: str) -> Iterator[tuple[Any, str]]:
    if not isinstance(schema, dict) or _is_expression_ref(schema):
        return
    if "$ref" in schema:
        ref = schema["$ref"]
        uri = ref if ref.startswith("http") else base.split("#")[0] + ref
        yield from _items_shapes(registry().resolver().lookup(uri).contents, uri)
        return
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            yield from _items_shapes(sub, base)
    if "items" in schema:
        yield schema["items"], base
