"""config/azure/platform-feed.bicep and its ARM JSON twin platform-feed.json: the Event Grid
system topic of the platform's scheduled events, its event subscription to a Storage queue
(Event Grid schema, delivered with the topic's managed identity), the queue and its role
assignments.

No Bicep compiler can be installed here (the CLI comes from GitHub releases or NuGet, neither
reachable). What is checked instead:

* the .bicep parses with pycep, the Bicep parser checkov uses (in checkov's own environment),
  and declares the same parameters, variables, resources (type and API version), literal
  property values, references, conditions, scopes and outputs as the .json;
* the .json validates against Azure's published resource manager schemas (test_azure_deploy.py,
  with the Event Grid and Storage schema files where the schema directory holds them) and
  passes the checks every template passes (test_azure_templates.py, test_arm_functions.py);
* checkov's Bicep and ARM checks find nothing beyond config/azure/checkov.yaml's accepted
  findings, each of which is needed;
* the platform's facts the template encodes (topic type, global location, subscription source,
  managed-identity delivery to a StorageQueue, the two built-in roles at the queue's scope).

What is not checked: that Azure accepts the deployment (what-if needs a subscription), and
Bicep's own type checks and linter (bicep build)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.consumption import arm_schemas
from tests.consumption import consumption_helpers as ch
from tests.k8s_tools import checkov, tool

BICEP = ch.AZURE_DIR / "platform-feed.bicep"
ARM = ch.AZURE_DIR / "platform-feed.json"
CHECKOV_CONFIG = ch.AZURE_DIR / "checkov.yaml"
ROLE_QUEUE_MESSAGE_PROCESSOR = "8a0f0c08-91a1-4084-bc3d-661d67233fed"
ROLE_QUEUE_MESSAGE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"


@pytest.fixture(scope="module")
def bicep() -> dict[str, Any]:
    """The .bicep as pycep parses it (checkov's parser, run in checkov's environment)."""
    python = Path(tool("checkov")).with_name("python")
    script = ("import json, sys, pathlib\nfrom pycep import BicepParser\n"
              "print(json.dumps(BicepParser().parse(file_path=pathlib.Path(sys.argv[1])), "
              "default=str))")
    done = subprocess.run([str(python), "-c", script, str(BICEP)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


@pytest.fixture(scope="module")
def arm() -> dict[str, Any]:
    template: dict[str, Any] = ch.load_json(ARM)
    return template


def decorators(item: dict[str, Any]) -> dict[str, Any]:
    return {d["type"]: d["argument"] for d in item.get("decorators", [])}


def unescape(text: str) -> str:
    return text.replace("\\'", "'")


# ------------------------------------------------------------------ the .bicep is the .json


def test_the_parameters_are_the_same(bicep: dict[str, Any], arm: dict[str, Any]) -> None:
    assert list(bicep["parameters"]) == list(arm["parameters"])
    for name, param in bicep["parameters"].items():
        twin = arm["parameters"][name]
        assert param["type"] == twin["type"], name
        marks = decorators(param)
        assert unescape(marks["description"]) == twin["metadata"]["description"], name
        assert marks.get("allowed") == twin.get("allowedValues"), name
        assert marks.get("min_length") == twin.get("minLength"), name
        assert marks.get("max_length") == twin.get("maxLength"), name
        default = param["default"]
        if isinstance(default, dict):  # an expression: resourceGroup().location
            assert twin["defaultValue"] == "[resourceGroup().location]", name
        elif default is None:
            assert "defaultValue" not in twin, name
        else:
            assert twin["defaultValue"] == default, name


def test_the_variables_are_the_same(bicep: dict[str, Any], arm: dict[str, Any]) -> None:
    assert list(bicep["variables"]) == list(arm["variables"])
    for name, variable in bicep["variables"].items():
        call = variable["value"]["function"]
        assert call["type"] == "subscription_resource_id"
        args = call["parameters"]
        assert arm["variables"][name] == (f"[subscriptionResourceId('{args['resource_type']}', "
                                          f"'{args['resource_name_1']}')]")


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and not ({"operator", "function"} & set(value)):
        for key, sub in value.items():
            yield from _leaves(sub, f"{path}/{key}")
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _leaves(sub, f"{path}[{i}]")
    else:
        yield path, value


def _arm_at(value: Any, path: str) -> Any:
    for part in re.findall(r"/([^/\[]+)|\[(\d+)\]", path):
        value = value[part[0]] if part[0] else value[int(part[1])]
    return value


def _pairs(bicep: dict[str, Any], arm: dict[str, Any]) -> list[tuple[str, dict[str, Any],
                                                                       dict[str, Any]]]:
    """(symbolic name, the .bicep resource's body, the .json resource) for every resource, the
    two role assignments told apart by their role."""
    out = []
    for symbol, resource in bicep["resources"].items():
        body = resource["config"]
        if "condition" in body:  # `= if (...) {...}`: pycep nests the body
            body = {**body["config"], "condition": body["condition"]}
        twins = [r for r in arm["resources"] if r["type"] == resource["type"]
                 and r["apiVersion"] == resource["api_version"]]
        if resource["type"] == "Microsoft.Authorization/roleAssignments":
            role = body["properties"]["roleDefinitionId"]
            twins = [r for r in twins
                     if r["properties"]["roleDefinitionId"] == f"[variables('{role}')]"]
        assert len(twins) == 1, (symbol, len(twins))
        out.append((symbol, body, twins[0]))
    return out


def test_the_resources_are_the_same(bicep: dict[str, Any], arm: dict[str, Any]) -> None:
    pairs = _pairs(bicep, arm)
    assert len(pairs) == len(arm["resources"])
    params, variables = set(bicep["parameters"]), set(bicep["variables"])
    symbols = set(bicep["resources"])
    compared = 0
    for symbol, body, twin in pairs:
        for key in ("location", "sku", "kind", "identity", "properties"):
            if key not in body:
                assert key not in twin, (symbol, key)
                continue
            for path, value in _leaves(body[key]):
                there = _arm_at(twin[key], path)
                where = f"{symbol}.{key}{path}"
                if isinstance(value, str) and value in params:
                    assert there == f"[parameters('{value}')]", where
                elif isinstance(value, str) and value in variables:
                    assert there == f"[variables('{value}')]", where
                elif isinstance(value, dict) or (isinstance(value, str) and value in symbols):
                    assert isinstance(there, str) and there.startswith("["), where
                else:
                    assert there == value, where
                compared += 1
        # The same condition, scope and explicit dependency.
        assert ("condition" in body) == ("condition" in twin), symbol
        if "scope" in body:
            assert body["scope"] == "queue", symbol
            assert "queueServices/{1}/queues/{2}" in twin["scope"], symbol
        for needed in body.get("dependsOn", []):
            assert bicep["resources"][needed]["type"] == "Microsoft.Authorization/roleAssignments"
            assert any("Microsoft.Authorization/roleAssignments" in d for d in twin["dependsOn"])
    assert compared >= 25


def test_the_outputs_are_the_same(bicep: dict[str, Any], arm: dict[str, Any]) -> None:
    assert list(bicep["outputs"]) == list(arm["outputs"]) == ["queueUrl", "systemTopicPrincipalId"]
    for name, output in bicep["outputs"].items():
        assert unescape(decorators(output)["description"]) == \
            arm["outputs"][name]["metadata"]["description"]
    assert "primaryEndpoints.queue" in arm["outputs"]["queueUrl"]["value"]


def test_the_comparison_sees_a_changed_value(bicep: dict[str, Any], arm: dict[str, Any]) -> None:
    changed = copy.deepcopy(arm)
    (subscription,) = [r for r in changed["resources"]
                       if r["type"] == "Microsoft.EventGrid/systemTopics/eventSubscriptions"]
    subscription["properties"]["eventDeliverySchema"] = "CloudEventSchemaV1_0"
    with pytest.raises(AssertionError, match=r"eventSubscription\.properties/eventDeliverySchema"):
        test_the_resources_are_the_same(bicep, changed)


# -------------------------------------------------------------------- what it says about Azure


def resource(arm: dict[str, Any], rtype: str) -> list[dict[str, Any]]:
    return [r for r in arm["resources"] if r["type"] == rtype]


def test_the_topic_is_the_subscriptions_maintenance_resources_topic(arm: dict[str, Any]) -> None:
    (topic,) = resource(arm, "Microsoft.EventGrid/systemTopics")
    assert topic["location"] == "global"
    assert topic["properties"] == {
        "source": "[subscription().id]",
        "topicType": "Microsoft.ResourceNotifications.MaintenanceResources"}
    assert topic["identity"] == {"type": "SystemAssigned"}


def test_events_reach_the_queue_in_the_event_grid_schema_with_the_topics_identity(
        arm: dict[str, Any]) -> None:
    (subscription,) = resource(arm, "Microsoft.EventGrid/systemTopics/eventSubscriptions")
    props = subscription["properties"]
    assert props["eventDeliverySchema"] == "EventGridSchema"
    assert "destination" not in props and "filter" not in props  # both type names pass
    delivery = props["deliveryWithResourceIdentity"]
    assert delivery["identity"] == {"type": "SystemAssigned"}
    assert delivery["destination"]["endpointType"] == "StorageQueue"
    assert delivery["destination"]["properties"]["queueName"] == "[parameters('queueName')]"
    (queue,) = resource(arm, "Microsoft.Storage/storageAccounts/queueServices/queues")
    assert queue["name"].endswith("parameters('queueName'))]")


def test_each_identity_holds_one_queue_role_on_the_queue_alone(arm: dict[str, Any]) -> None:
    roles = {}
    for assignment in resource(arm, "Microsoft.Authorization/roleAssignments"):
        role = assignment["properties"]["roleDefinitionId"]
        var = re.fullmatch(r"\[variables\('(\w+)'\)\]", role)
        assert var, assignment
        guid = re.search(r"'([0-9a-f-]{36})'", arm["variables"][var[1]])
        assert guid
        roles[guid[1]] = assignment
        assert "queueServices/{1}/queues/{2}" in assignment["scope"]
    assert set(roles) == {ROLE_QUEUE_MESSAGE_PROCESSOR, ROLE_QUEUE_MESSAGE_SENDER}
    sender = roles[ROLE_QUEUE_MESSAGE_SENDER]["properties"]
    assert "identity.principalId" in sender["principalId"] and "systemTopics" in \
        sender["principalId"]
    processor = roles[ROLE_QUEUE_MESSAGE_PROCESSOR]
    assert processor["properties"]["principalId"] == "[parameters('exporterPrincipalId')]"
    assert "empty(parameters('exporterPrincipalId'))" in processor["condition"]


def test_the_account_takes_entra_id_only(arm: dict[str, Any]) -> None:
    (account,) = resource(arm, "Microsoft.Storage/storageAccounts")
    props = account["properties"]
    assert props["allowSharedKeyAccess"] is False and props["allowBlobPublicAccess"] is False
    assert props["networkAcls"]["bypass"] == "AzureServices"


needs_schemas = pytest.mark.skipif(bool(arm_schemas.MISSING), reason=arm_schemas.MISSING)


@needs_schemas
def test_the_schema_check_bites_on_this_template(arm: dict[str, Any]) -> None:
    missing = arm_schemas.missing_provider_schemas(arm)
    if missing:
        pytest.skip(f"add {', '.join(missing)} to {arm_schemas.SCHEMA_DIR}")
    assert arm_schemas.validate_template(arm) == []
    broken = copy.deepcopy(arm)
    (subscription,) = resource(broken, "Microsoft.EventGrid/systemTopics/eventSubscriptions")
    subscription["properties"]["eventDeliverySchema"] = "EventGrid"
    destination = subscription["properties"]["deliveryWithResourceIdentity"]["destination"]
    destination["properties"]["queueNam"] = destination["properties"].pop("queueName")
    messages = [p.message for p in arm_schemas.validate_template(broken)]
    assert any("'EventGrid'" in m for m in messages), messages
    assert any("queueNam" in m for m in messages), messages


# ------------------------------------------------------------------------------------ checkov


def accepted_checks() -> dict[str, str]:
    text = CHECKOV_CONFIG.read_text(encoding="utf-8")
    found = dict(re.findall(r"^\s+- (CKV2?_AZURE_\d+)\s+#\s*(.*)$", text, re.M))
    assert sorted(found) == sorted(yaml.safe_load(text)["skip-check"])
    return found


def _checkov(tmp_path: Path, config: Path | None) -> dict[str, Any]:
    for path in (BICEP, ARM):
        (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return checkov(tmp_path, config, frameworks=("bicep", "arm"))


def test_checkov_finds_nothing_unexplained(tmp_path: Path) -> None:
    report = _checkov(tmp_path, CHECKOV_CONFIG)
    assert report["failed"] == [], [(f["file_path"], f["check_id"]) for f in report["failed"]]
    assert report["passed"] >= 8  # both files were read
    for check, reason in accepted_checks().items():
        assert len(reason) > 30, check


def test_every_checkov_skip_is_needed_by_both_files(tmp_path: Path) -> None:
    report = _checkov(tmp_path, None)
    by_file: dict[str, set[str]] = {}
    for failure in report["failed"]:
        by_file.setdefault(Path(failure["file_path"]).suffix, set()).add(failure["check_id"])
    accepted = set(accepted_checks())
    assert by_file == {".bicep": accepted, ".json": accepted}
