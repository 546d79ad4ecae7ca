"""docs/consumption.md opens with the choice of an Azure route, in one table: every file the
table names exists, every template parameter it names is one the template takes, every
Temporality value it names is one its dashboard offers, and the landing paths' heading counts
the columns beneath it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.consumption import consumption_helpers as ch
from tests.test_doc_references import anchors

GUIDE = ch.REPO / "docs" / "consumption.md"
TEXT = GUIDE.read_text(encoding="utf-8")
ROUTES = 5
#: The table's rows, by their label: what a reader must find for every route.
ROWS = ("exporter settings", "protocol and ports", "preview registration", "lands in",
        "metrics temporality", "histogram aggregation", "rules file", "query pack",
        "dashboard, Temporality value", "Microsoft's page")
NUMBERS = {"Two": 2, "Three": 3, "Four": 4, "Five": 5}


def section(heading: str) -> str:
    """The text of the ``## heading`` section, up to the next ``## ``; empty when there is
    none (the tests then fail on what is missing, not at collection)."""
    start = TEXT.find(f"\n## {heading}\n")
    if start == -1:
        return ""
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:end if end != -1 else len(TEXT)]


def table(text: str) -> list[list[str]]:
    """The first markdown table of ``text``, as rows of stripped cells (the ruler left out)."""
    lines = [line for line in text.splitlines() if line.startswith("|")] or ["| |"]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    return [row for row in rows if not all(set(cell) <= {"-", ":"} for cell in row)]


ROUTE_SECTION = section("Pick a route")
ROUTE_TABLE = table(ROUTE_SECTION)


def row(label: str) -> list[str]:
    """The cells of the row whose label starts with ``label``, one per route."""
    (found,) = [cells[1:] for cells in ROUTE_TABLE[1:] if cells[0].startswith(label)]
    return found


def test_the_guide_opens_with_the_route_choice() -> None:
    assert re.findall(r"^## (.+)$", TEXT, re.M)[0] == "Pick a route"
    choices = re.findall(r"^(\d)\. \*\*", ROUTE_SECTION, re.M)
    assert choices == [str(n) for n in range(1, ROUTES + 1)]
    # Every link of the section to a heading of this guide lands on one.
    links = re.findall(r"\]\(#([\w-]+)\)", ROUTE_SECTION)
    assert len(links) >= ROUTES
    assert set(links) <= anchors(GUIDE), set(links) - anchors(GUIDE)


def test_the_table_gives_every_route_every_row() -> None:
    header = ROUTE_TABLE[0]
    assert len(header) == ROUTES + 1
    assert [h.split(".", 1)[0] for h in header[1:]] == [str(n) for n in range(1, ROUTES + 1)]
    labels = [cells[0] for cells in ROUTE_TABLE[1:]]
    for label in ROWS:
        assert any(found.startswith(label) for found in labels), label
    for cells in ROUTE_TABLE[1:]:
        assert len(cells) == ROUTES + 1 and all(cells), cells[0]
    for cell in row("metrics temporality") + row("histogram aggregation"):
        # Each route says which setting it needs, and how strongly.
        assert re.search(r"\*\*(required|recommended)\*\*|does not apply|either|as route",
                         cell), cell
    for cell in row("preview registration"):
        assert cell.startswith(("**yes**", "**no**")), cell
    for cell in row("Microsoft's page"):
        assert re.search(r"\]\(https://learn\.microsoft\.com/en-us/azure/azure-monitor/", cell)


def test_the_agent_route_names_the_ports_its_settings_use() -> None:
    agent = row("protocol and ports")[0]
    assert "gRPC only" in agent and "localhost:4317" in agent and "localhost:4319" in agent


def test_every_file_the_table_names_exists() -> None:
    named = set(re.findall(r"`(config/[^`\s]+)`", ROUTE_SECTION))
    assert len(named) >= 15, named
    missing = sorted(name for name in named if not (ch.REPO / name).exists())
    assert not missing, missing
    # A directory is named as one (the query packs), a file as a file.
    for name in named:
        assert (ch.REPO / name).is_dir() == name.endswith("/"), name


def test_every_template_parameter_named_is_one_the_template_takes() -> None:
    allowed = {
        "route": ch.load_json(ch.AZURE_DIR / "prometheus-rule-groups.json")
        ["parameters"]["route"]["allowedValues"],
        "landingPath": ch.load_json(ch.AZURE_DIR / "alert-rules.json")
        ["parameters"]["landingPath"]["allowedValues"],
    }
    named = re.findall(r"`(route|landingPath)=([\w-]+)`", ROUTE_SECTION)
    assert {name for name, _ in named} == set(allowed)
    for name, value in named:
        assert value in allowed[name], (name, value)
    # Every landing path and every rule-group route is some route's.
    assert {v for n, v in named if n == "landingPath"} == set(allowed["landingPath"])
    assert {v for n, v in named if n == "route"} == set(allowed["route"])


def temporality_options(dashboard: dict[str, Any]) -> set[str] | None:
    """The texts of the dashboard's Temporality variable; None when it has none."""
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("label") == "Temporality":
            return {option["text"] for option in variable["options"]}
    return None


@pytest.mark.parametrize("route", range(ROUTES), ids=lambda i: f"route {i + 1}")
def test_the_temporality_value_is_one_its_dashboard_offers(route: int) -> None:
    cell = row("dashboard, Temporality value")[route]
    (path,) = re.findall(r"`(config/grafana/[^`]+\.json)`", cell)
    options = temporality_options(ch.load_json(ch.REPO / path))
    if "no Temporality variable" in cell:
        assert options is None, path
        return
    named = set(re.findall(r"`(\w+)`", cell.split(",", 1)[1]))
    assert named and options is not None and named <= options, (named, options)
    # The default value is the one the temporality row recommends.
    recommended = re.search(r"`(\w+)`[^.;]*\*\*recommended\*\*", row("metrics temporality")[route])
    assert recommended and f"Temporality `{recommended[1]}`" in cell


def test_the_landing_paths_heading_counts_its_columns() -> None:
    (word,) = re.findall(r"^## (\w+) landing paths$", TEXT, re.M)
    columns = len(table(section(f"{word} landing paths"))[0]) - 1
    assert NUMBERS[word] == columns

