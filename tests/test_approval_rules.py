"""Approval rules and decisions (docs/semantics.md#approval-opt-in): parsing ``SEE_APPROVE*`` and
:func:`decide`, pure."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.approval_rules import (
    ApprovalConfig,
    Decision,
    ReportOnce,
    Rule,
    decide,
    leader,
)
from scheduled_events_exporter.config import ConfigError, load_config
from scheduled_events_exporter.hook import event_json, hook_environment
from scheduled_events_exporter.model import ScheduledEvent

VM = "vm-a"
RULES = "a comma-separated list of user, freeze<=N, type:<EventType>, all"
FREEZE = "freeze<=N with N a whole number of seconds >= 0 (e.g. freeze<=9)"
TYPE = (
    "type:<EventType> with an event type such as Reboot, Redeploy, Freeze, Preempt or Terminate"
)
TIMEOUT = "expected seconds, a number from 1 to 3600"


def ev(
    event_id: str = "E1",
    *,
    status: str = "Scheduled",
    event_type: str = "Reboot",
    source: str = "Platform",
    resources: tuple[str, ...] = (VM,),
    duration: int = -1,
) -> ScheduledEvent:
    return ScheduledEvent(
        event_id=event_id,
        status=status,
        event_type=event_type,
        resource_type="VirtualMachine",
        resources=resources,
        not_before=(datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)
                    if status == "Scheduled" else None),
        description="Host server is undergoing maintenance.",
        source=source,
        duration=duration,
    )


def config(*rules: Rule, **kw: object) -> ApprovalConfig:
    return ApprovalConfig(rules=rules, **kw)  # type: ignore[arg-type]


def parse_approval_config(env: dict[str, str]) -> tuple[ApprovalConfig | None, list[str]]:
    """The approval settings as the configuration reads them (rows of its one table), alone:
    the other settings at their defaults, no state directory."""
    try:
        return load_config({"SEE_STATE_DIR": "", **env}).approval, []
    except ConfigError as exc:
        return None, exc.problems


def described(env: dict[str, str]) -> list[str]:
    """What check-config prints for these settings."""
    return load_config({"SEE_STATE_DIR": "", **env}).describe(env)


# --- parsing -----------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("env", [{}, {"SEE_APPROVE": ""}, {"SEE_APPROVE": "  "}])
def test_unset_or_empty_means_off(env: dict[str, str]) -> None:
    assert parse_approval_config(env) == (None, [])


@pytest.mark.timeout(10)
def test_documented_example() -> None:
    cfg, problems = parse_approval_config({"SEE_APPROVE": "user,freeze<=9"})
    assert problems == []
    assert cfg == ApprovalConfig(rules=(Rule("user"), Rule("freeze", max_duration=9)))
    assert (cfg.multi, cfg.dry_run, cfg.hook, cfg.hook_timeout) == ("leader", False, "", 60.0)


@pytest.mark.timeout(10)
def test_every_setting_spaces_and_case_tolerated() -> None:
    cfg, problems = parse_approval_config(
        {
            "SEE_APPROVE": " User , FREEZE <= 8 , type:reboot,all ",
            "SEE_APPROVE_MULTI": "ANY",
            "SEE_APPROVE_DRY_RUN": "yes",
            "SEE_APPROVE_HOOK": " /usr/local/bin/drain --grace 30 ",
            "SEE_APPROVE_HOOK_TIMEOUT": "120",
        }
    )
    assert problems == []
    assert cfg is not None
    assert [r.text for r in cfg.rules] == ["user", "freeze<=8", "type:reboot", "all"]
    assert (cfg.multi, cfg.dry_run, cfg.hook_timeout) == ("any", True, 120.0)
    assert cfg.hook == "/usr/local/bin/drain --grace 30"
    assert "SEE_APPROVE=user,freeze<=8,type:reboot,all" in described({
        "SEE_APPROVE": " User , FREEZE <= 8 , type:reboot,all "})


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "value,dry",
    [("true", True), ("1", True), ("YES", True), ("false", False), ("0", False), ("no", False)],
)
def test_dry_run_spellings(value: str, dry: bool) -> None:
    cfg, problems = parse_approval_config({"SEE_APPROVE": "all", "SEE_APPROVE_DRY_RUN": value})
    assert problems == [] and cfg is not None and cfg.dry_run is dry


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "env,problem",
    [
        ({"SEE_APPROVE": "freeze<=x"}, f"SEE_APPROVE='freeze<=x': expected {FREEZE}"),
        ({"SEE_APPROVE": "freeze<=-1"}, f"SEE_APPROVE='freeze<=-1': expected {FREEZE}"),
        ({"SEE_APPROVE": "freeze"}, f"SEE_APPROVE='freeze': expected {FREEZE}"),
        ({"SEE_APPROVE": "freeze<9"}, f"SEE_APPROVE='freeze<9': expected {FREEZE}"),
        (
            {"SEE_APPROVE": "user,freeze<=1.5"},
            f"SEE_APPROVE='user,freeze<=1.5': expected {FREEZE}, got 'freeze<=1.5'",
        ),
        ({"SEE_APPROVE": "type:"}, f"SEE_APPROVE='type:': expected {TYPE}"),
        ({"SEE_APPROVE": "type:re boot"}, f"SEE_APPROVE='type:re boot': expected {TYPE}"),
        ({"SEE_APPROVE": "platform"}, f"SEE_APPROVE='platform': expected {RULES}"),
        (
            {"SEE_APPROVE": "user,bogus"},
            f"SEE_APPROVE='user,bogus': expected {RULES}, got 'bogus'",
        ),
        (
            {"SEE_APPROVE": "user,,all"},
            f"SEE_APPROVE='user,,all': expected {RULES}, without empty items, got ''",
        ),
        (
            {"SEE_APPROVE": "user,USER"},
            "SEE_APPROVE='user,USER': expected each rule once, got 'USER'",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_MULTI": "both"},
            "SEE_APPROVE_MULTI='both': expected leader or any",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_DRY_RUN": "maybe"},
            "SEE_APPROVE_DRY_RUN='maybe': expected true or false (or 1/0, yes/no)",
        ),
        pytest.param(
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK": "echo 'unclosed"},
            "SEE_APPROVE_HOOK=\"echo 'unclosed\": expected a command line for /bin/sh -c "
            "(No closing quotation)",
            marks=pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell syntax; "
                                     "Windows checks only a PowerShell command's length"),
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK": "x", "SEE_APPROVE_HOOK_TIMEOUT": "0"},
            f"SEE_APPROVE_HOOK_TIMEOUT='0': {TIMEOUT}",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK": "x", "SEE_APPROVE_HOOK_TIMEOUT": "3601"},
            f"SEE_APPROVE_HOOK_TIMEOUT='3601': {TIMEOUT}",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK": "x", "SEE_APPROVE_HOOK_TIMEOUT": "nan"},
            f"SEE_APPROVE_HOOK_TIMEOUT='nan': {TIMEOUT}",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK": "x", "SEE_APPROVE_HOOK_TIMEOUT": "soon"},
            f"SEE_APPROVE_HOOK_TIMEOUT='soon': {TIMEOUT}",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK_TIMEOUT": "30"},
            "SEE_APPROVE_HOOK_TIMEOUT='30': expected only together with SEE_APPROVE_HOOK "
            "(there is no hook to time out)",
        ),
        (
            {"SEE_APPROVE": "user", "SEE_APPROVE_HOOK_TIMOUT": "30"},
            "SEE_APPROVE_HOOK_TIMOUT='30': expected one of SEE_APPROVE, SEE_APPROVE_MULTI, "
            "SEE_APPROVE_DRY_RUN, SEE_APPROVE_HOOK, SEE_APPROVE_HOOK_TIMEOUT, "
            "SEE_APPROVE_HOOK_ENV (unknown approval setting)",
        ),
    ],
)
def test_each_invalid_form_is_one_exact_line(env: dict[str, str], problem: str) -> None:
    assert parse_approval_config(env) == (None, [problem])


@pytest.mark.timeout(10)
def test_every_problem_is_reported_at_once() -> None:
    cfg, problems = parse_approval_config(
        {"SEE_APPROVE": "freeze<=x,user", "SEE_APPROVE_MULTI": "all", "SEE_APPROVE_DRY_RUN": "?"}
    )
    assert cfg is None
    assert [p.split(":", 1)[0] for p in problems] == [
        "SEE_APPROVE='freeze<=x,user'",
        "SEE_APPROVE_MULTI='all'",
        "SEE_APPROVE_DRY_RUN='?'",
    ]


@pytest.mark.timeout(10)
def test_leftovers_without_see_approve_are_problems() -> None:
    cfg, problems = parse_approval_config(
        {"SEE_APPROVE": " ", "SEE_APPROVE_DRY_RUN": "true", "SEE_APPROVE_HOOK": "drain"}
    )
    assert cfg is None
    tail = (
        "expected only together with SEE_APPROVE "
        "(set SEE_APPROVE to enable approval, or unset this)"
    )
    assert problems == [
        f"SEE_APPROVE_DRY_RUN='true': {tail}",
        f"SEE_APPROVE_HOOK='drain': {tail}",
    ]
    # Set-but-empty companions are as good as unset.
    assert parse_approval_config({"SEE_APPROVE_MULTI": ""}) == (None, [])


# --- decide ------------------------------------------------------------------------------------

USER, ALL = Rule("user"), Rule("all")
FREEZE5, REBOOT = Rule("freeze", max_duration=5), Rule("type", event_type="reboot")


def approve(rule: str) -> Decision:
    return Decision("E1", "approve", "approved", rule, f"rule {rule}")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "event,cfg,vm,expected",
    [
        # Which rules match.
        (ev(source="User"), config(USER), VM, approve("user")),
        (ev(source="Platform"), config(USER), VM, None),
        (ev(event_type="Freeze", duration=5), config(FREEZE5), VM, approve("freeze<=5")),
        (ev(event_type="freeze", duration=0), config(FREEZE5), VM, approve("freeze<=5")),
        (ev(event_type="Freeze", duration=30), config(FREEZE5), VM, None),
        (ev(event_type="Freeze", duration=-1), config(FREEZE5), VM, None),
        (ev(event_type="Reboot", duration=5), config(FREEZE5), VM, None),
        (ev(event_type="Reboot"), config(REBOOT), VM, approve("type:reboot")),
        (ev(event_type="Redeploy"), config(REBOOT), VM, None),
        (ev(event_type="Preempt"), config(ALL), VM, approve("all")),
        (ev(source="User"), config(REBOOT, USER), VM, approve("type:reboot")),  # first rule wins
        # Only Scheduled events.
        (ev(status="Started", source="User"), config(USER), VM, None),
        (ev(status="Paused", source="User"), config(USER), VM, None),
        # Guard rails.
        (ev(resources=("vm-b",)), config(ALL), VM, "not_self"),
        (ev(resources=()), config(ALL), VM, "not_self"),
        (ev(), config(ALL), "", "not_self"),
        (ev(resources=("VM-A",)), config(ALL), "vm-a", approve("all")),
        (ev(resources=("VM-b", "vm-A")), config(ALL), "Vm-a", approve("all")),  # leader
        (ev(resources=("vm-A", "VM-b")), config(ALL), "vm-B", "not_leader"),  # follower
        (ev(resources=("vm-b", "vm-a")), config(ALL, multi="any"), "vm-b", approve("all")),
        (ev(resources=("vm-a", "VM-A")), config(ALL), "VM-A", approve("all")),  # one VM, twice
        (ev(), config(ALL, dry_run=True), VM, "dry_run"),
        (ev(resources=("vm-b",)), config(ALL, dry_run=True), VM, "not_self"),  # order
        (ev(resources=("vm-0", "vm-a")), config(ALL, dry_run=True), VM, "not_leader"),
    ],
)
def test_decide(event: ScheduledEvent, cfg: ApprovalConfig, vm: str, expected: object) -> None:
    decision = decide(event, vm_name=vm, config=cfg, already_approved=())
    if isinstance(expected, str):
        assert decision is not None
        assert (decision.action, decision.reason, decision.event_id) == ("skip", expected, "E1")
        assert decision.detail.endswith(f"(rule {decision.rule})")
    else:
        assert decision == expected


@pytest.mark.timeout(10)
def test_decide_names_the_leader() -> None:
    decision = decide(ev(resources=("vm-c", "VM-B", "vm-a")), vm_name="vm-c", config=config(ALL),
                      already_approved=())
    assert decision is not None and decision.reason == "not_leader"
    assert decision.detail == "vm-a approves events for 3 VMs (rule all)"
    assert leader(["vm-c", "VM-B", "vm-a"]) == "vm-a" and leader([]) is None


@pytest.mark.timeout(10)
def test_already_approved_is_never_decided_again() -> None:
    for cfg in (config(ALL), config(ALL, dry_run=True)):
        assert decide(ev(), vm_name=VM, config=cfg, already_approved={"E1"}) is None
        assert decide(ev(), vm_name=VM, config=cfg, already_approved={"E2"}) is not None


names = st.text(alphabet="abAB-0", min_size=0, max_size=4)
events = st.builds(
    ScheduledEvent,
    event_id=st.sampled_from(["E1", "E2"]),
    status=st.sampled_from(["Scheduled", "Started", "Paused", ""]),
    event_type=st.sampled_from(["Freeze", "Reboot", "Redeploy", "freeze", ""]),
    resources=st.lists(names, max_size=4).map(tuple),
    source=st.sampled_from(["User", "Platform", "user", ""]),
    duration=st.integers(min_value=-2, max_value=40),
)
rules = st.lists(
    st.one_of(
        st.sampled_from([USER, ALL, REBOOT]),
        st.integers(0, 40).map(lambda n: Rule("freeze", max_duration=n)),
    ),
    min_size=1,
    max_size=4,
).map(tuple)
configs = st.builds(
    ApprovalConfig, rules=rules, multi=st.sampled_from(["leader", "any"]), dry_run=st.booleans()
)


@pytest.mark.timeout(60)
@given(event=events, cfg=configs, vm=names, done=st.sets(st.sampled_from(["E1", "E2"])))
def test_never_approves_for_another_vm_or_a_non_scheduled_event(
    event: ScheduledEvent, cfg: ApprovalConfig, vm: str, done: set[str]
) -> None:
    decision = decide(event, vm_name=vm, config=cfg, already_approved=done)
    if decision is None:
        return
    assert event.status == "Scheduled" and event.event_id not in done
    assert any(r.matches(event) for r in cfg.rules)
    if decision.action == "approve":
        assert vm and vm.casefold() in {r.casefold() for r in event.resources}
        assert not cfg.dry_run
    else:
        assert decision.reason in ("not_self", "not_leader", "dry_run")


# --- helpers -----------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_report_once_per_event_and_reason() -> None:
    once = ReportOnce()
    assert once.first("E1", "dry_run") and not once.first("E1", "dry_run")
    assert once.first("E1", "not_self") and once.first("E2", "dry_run")
    once.retain({"E2"})
    assert once.first("E1", "dry_run") and not once.first("E2", "dry_run")


@pytest.mark.timeout(10)
def test_hook_sees_the_imds_shape_and_event_variables() -> None:
    event = ev(source="User", resources=("vm-a", "vm-b"), duration=7)
    assert json.loads(json.dumps(event_json(event))) == {
        "EventId": "E1",
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-a", "vm-b"],
        "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "User",
        "DurationInSeconds": 7,
    }
    env = hook_environment(event, {"PATH": "/bin", "SECRET": "s"}, drop={"SECRET"})
    assert env == {
        "PATH": "/bin",
        "SEE_EVENT_ID": "E1",
        "SEE_EVENT_TYPE": "Reboot",
        "SEE_EVENT_STATUS": "Scheduled",
        "SEE_EVENT_SOURCE": "User",
        "SEE_EVENT_RESOURCES": "vm-a,vm-b",
        "SEE_EVENT_NOT_BEFORE": "2022-04-11T22:26:58.000Z",
        "SEE_EVENT_DURATION": "7",
    }
    assert event_json(ev(status="Started"))["NotBefore"] == ""


@pytest.mark.timeout(10)
def test_the_exec_form_is_an_argument_vector_run_without_a_shell() -> None:
    env = {"SEE_APPROVE": "user",
           "SEE_APPROVE_HOOK": f' [{json.dumps(sys.executable)}, "-c", "print(1)", "a b"] '}
    cfg, problems = parse_approval_config(env)
    assert problems == [] and cfg is not None
    assert cfg.hook == (sys.executable, "-c", "print(1)", "a b")
    assert f"SEE_APPROVE_HOOK={json.dumps([sys.executable, '-c', 'print(1)', 'a b'])}" in \
        described(env)


EXEC_FORM = 'expected a JSON array of strings, the program first (e.g. ["/hooks/drain", ' \
    '"--grace", "60"])'


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("hook", "says"), [
    ('["/bin/true", ', "it is not JSON"),
    ("[]", EXEC_FORM),
    ('["/bin/true", 3]', EXEC_FORM),
    ('[["/bin/true"]]', EXEC_FORM),
    ('["", "x"]', "with a program name and no NUL character"),
    ('["/bin/true", "a\\u0000b"]', "with a program name and no NUL character"),
    ('["/no/such/hook", "--now"]', "'/no/such/hook' is not an executable file"),
    ('["no-such-hook-on-path"]', "'no-such-hook-on-path' is not found on PATH"),
])
def test_a_wrong_exec_form_is_one_clear_line(hook: str, says: str) -> None:
    cfg, problems = parse_approval_config({"SEE_APPROVE": "user", "SEE_APPROVE_HOOK": hook})
    assert cfg is None and len(problems) == 1
    assert problems[0].startswith("SEE_APPROVE_HOOK=") and says in problems[0], problems


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX: Windows runs PowerShell")
def test_a_command_line_without_a_shell_names_the_exec_form_and_the_shell_image() -> None:
    from scheduled_events_exporter.platforms.shell import PosixShell  # type: ignore[attr-defined]

    problem = PosixShell(sh="/no/shell/here").check("drain --grace 60")
    assert problem.startswith("a command line needs /no/shell/here, which is not here")
    assert '["/hooks/drain", "--grace", "60"]' in problem and "-shell tag" in problem
    assert PosixShell(sh="/no/shell/here").check(("/bin/true",)) == ""  # exec form: no shell
