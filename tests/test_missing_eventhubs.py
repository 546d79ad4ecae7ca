"""``SEE_SINKS=eventhubs`` on an install without the Event Hubs packages: a configuration error.

``azure-eventhub`` and ``azure-identity`` are regular dependencies, but a trimmed install (or
one made before they were) may lack them. The real CLI runs in a subprocess whose
``sitecustomize`` makes those packages unimportable exactly as if they were not installed
(``ModuleNotFoundError``); ``run`` and ``check-config`` must then exit 2 with one line naming
``SEE_SINKS`` and what to install, and no traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.exporter_process import clean_env, state_dir

BLOCKER = '''
import sys

class _NotInstalled:
    """Behave as if these distributions were not installed."""
    blocked = {blocked!r}

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.blocked):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''
CONNECTION = ("Endpoint=sb://127.0.0.1:5999;SharedAccessKeyName=k;SharedAccessKey=dGVzdA==;"
              "EntityPath=hub")


def run_cli(tmp_path: Path, command: str, blocked: list[str],
            **env: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    return subprocess.run(
        [sys.executable, "-m", "scheduled_events_exporter", command],
        env=clean_env(PYTHONPATH=str(site), SEE_SINKS="eventhubs", SEE_HEALTH_ADDR="",
                      SEE_STATE_DIR=state_dir(tmp_path), **env),
        capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_connection_string_without_azure_eventhub(tmp_path: Path, command: str) -> None:
    result = run_cli(tmp_path, command, ["azure.eventhub"],
                     SEE_EVENTHUB_CONNECTION_STRING=CONNECTION)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (
        "configuration error: SEE_SINKS='eventhubs': the eventhubs sink needs azure-eventhub, "
        "which is not installed; expected it installed (pip install 'azure-eventhub>=5.12.0,<6') "
        "or eventhubs removed from SEE_SINKS")
    assert "dGVzdA==" not in result.stderr + result.stdout


def test_managed_identity_without_either_package(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "check-config", ["azure.eventhub", "azure.identity"],
                     SEE_EVENTHUB_NAMESPACE="ns.servicebus.windows.net", SEE_EVENTHUB_NAME="hub")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert "SEE_SINKS='eventhubs'" in line and "azure-eventhub and azure-identity" in line
    assert "pip install 'azure-eventhub>=5.12.0,<6' 'azure-identity>=1.16.1,<2'" in line


def test_the_install_advice_is_the_range_pyproject_declares() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                              .read_text(encoding="utf-8"))
    declared = pyproject["project"]["dependencies"]
    assert "azure-eventhub>=5.12.0,<6" in declared and "azure-identity>=1.16.1,<2" in declared


def test_the_blocker_is_the_only_difference(tmp_path: Path) -> None:
    """Without blocking anything the same invocation is valid (exit 0)."""
    result = run_cli(tmp_path, "check-config", [], SEE_EVENTHUB_CONNECTION_STRING=CONNECTION)
    assert result.returncode == 0, result.stderr
    assert "SEE_SINKS=eventhubs" in result.stdout
