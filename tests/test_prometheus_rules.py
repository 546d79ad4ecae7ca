"""`promtool test rules` unit tests of config/prometheus/: every alert has a case where it fires and
one where it stays quiet, and promtool passes them (with the rules' `for:` durations)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.peers.prometheus import skip_unless_installed

REPO = Path(__file__).resolve().parents[1]
RULES_DIR = REPO / "config" / "prometheus"
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yaml"))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

pytestmark = skip_unless_installed("promtool")


def alerts() -> set[str]:
    names = set()
    for path in RULES_DIR.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            names |= {r["alert"] for r in group["rules"] if "alert" in r}
    return names


def cases() -> list[tuple[str, bool]]:
    """(alertname, expects firing) of every alert_rule_test."""
    out = []
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for case in test.get("alert_rule_test", []):
                out.append((case["alertname"], bool(case.get("exp_alerts"))))
    return out


def test_every_alert_is_tested_firing_and_quiet() -> None:
    assert TEST_FILES
    tested = cases()
    for alert in sorted(alerts()):
        assert (alert, True) in tested, f"{alert}: no case where it fires"
        assert (alert, False) in tested, f"{alert}: no case where it stays quiet"


def test_promtool_test_rules_passes() -> None:
    proc = subprocess.run([PROMTOOL, "test", "rules", *map(str, TEST_FILES)],
                          capture_output=True, text=True, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules_detects_a_wrong_expectation(tmp_path: Path) -> None:
    # The harness is not vacuous: a test expecting the wrong labels fails.
    source = TEST_FILES[0]
    text = source.read_text(encoding="utf-8").replace("instance: vm1", "instance: vm9", 1)
    text = text.replace("../scheduled-events-alerts.yaml",
                        str(RULES_DIR / "scheduled-events-alerts.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text(text, encoding="utf-8")
    proc = subprocess.run([PROMTOOL, "test", "rules", str(broken)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr
