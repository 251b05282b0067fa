"""The README is a front door (two commands first, links that resolve); the
reference pages stay in sync with the code they describe."""

import re
from pathlib import Path

import mx_proxy as mxp
from mx_proxy.numerics import recipe as recipes

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands_and_stays_short():
    first_block = README.split("```")[1]
    commands = [line for line in first_block.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2 and "mx-proxy figures" in commands[0] and "pytest" in commands[1]
    assert len(README.splitlines()) <= 150


def test_ci_runs_the_readmes_test_commands():
    """Both tiers' commands (the unit tier less its venv creation) appear verbatim in .ci/run, each its own
    timed step."""
    lines = [line for line in README.split("```")[1].splitlines() if "pytest" in line and not line.startswith("#")]
    ci = (ROOT / ".ci" / "run").read_text()
    assert len(lines) == 2 and "-m e2e" in lines[1] and "-m e2e" not in lines[0]
    assert lines[0].split("&& ", 2)[-1] in ci and lines[1] in ci
    assert "ci step 1, the unit tier" in ci and "ci step 2, the end-to-end tier" in ci


def test_every_link_resolves():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if target.startswith("http"):
                continue
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_recipe_doc_table_matches_the_presets():
    text = (ROOT / "docs" / "recipes.md").read_text()
    table = text.split("<!-- recipe-table -->\n", 1)[1].split("\n<!-- /recipe-table -->", 1)[0]
    assert table == recipes.table()
    for name in mxp.MITIGATIONS:
        assert f"| `{name}` |" in text
