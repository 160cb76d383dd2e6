"""The documentation that could drift is generated or compared here: the
generated parts of docs/ equal what the code generates now, the state
diagram's lines agree with the SQL they describe, every alert has its
runbook, the README's Stripe events are the ones the engine applies, and no
text in the repository cites a document outside it."""

from __future__ import annotations

import re
import subprocess
from dataclasses import fields

import pytest
import yaml

from devtools import docs
from paycron.config import Config
from paycron.domain.enums import Status
from paycron.sql import parse_blocks
from paycron.store.processor_events import SETTLING_TYPES

ROOT = docs.REPO_ROOT
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(docs.PARTS))
def test_each_generated_part_is_what_the_code_generates_now(name):
    path, generate = docs.PARTS[name]
    text = path.read_text()
    assert docs.rewritten(text, name, generate()) == text, (
        f"{path.name} is stale: run python -m devtools.docs"
    )


def test_the_api_reference_is_generated_from_the_document_the_web_serves(client):
    assert docs.openapi_document() == client.get("/openapi.json").get_json()


def test_every_setting_has_a_description_in_the_code():
    comments = docs.setting_comments(docs.CONFIG_SOURCE.read_text())
    for f in fields(Config):
        if "parse" in f.metadata:
            assert comments.get(f.name), f"Config.{f.name} has no #: comment"


def _guarded_update(body: str) -> tuple[set[str], set[str] | None]:
    """The statuses an ``UPDATE payments`` block requires (its WHERE) and
    the literal one it sets (None when the target is a parameter)."""
    update = body[body.index("UPDATE payments") :]
    set_part, where = update.split("WHERE", 1)
    where = where.split("RETURNING", 1)[0]
    sources = set(re.findall(r"\bstatus\s*=\s*'(\w+)'", where))
    for listed in re.findall(r"\bstatus\s+IN\s*\(([^)]*)\)", where):
        sources |= set(re.findall(r"'(\w+)'", listed))
    literal = re.search(r"SET\s+status\s*=\s*'(\w+)'", set_part)
    return sources, ({literal.group(1)} if literal else None)


def test_the_state_diagram_agrees_with_the_sql_it_is_drawn_from():
    blocks = parse_blocks(docs.TRANSITIONS_SQL.read_text())
    annotated = {name: (sources, targets) for name, sources, targets in docs.transitions()}
    changing = {name for name, body in blocks.items() if re.search(r"SET\s+status\s*=", body)}
    assert set(annotated) == changing, "a block that sets status needs a -- transition: line"
    statuses = {s.value for s in Status}
    for name, (sources, targets) in annotated.items():
        guard, literal = _guarded_update(blocks[name])
        assert set(sources) == guard, (name, sources, guard)
        assert set(targets) <= statuses, name
        if literal is not None:
            assert set(targets) == literal, (name, targets, literal)


def test_the_state_diagram_reaches_every_status():
    drawn = docs.state_diagram()
    for status in Status:
        assert f"--> {status.value}" in drawn, status


def test_every_alert_has_its_runbook():
    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    operations = (ROOT / "docs" / "operations.md").read_text()
    runbooks = set(re.findall(r"^### (Paycron\w+)$", operations, re.MULTILINE))
    assert runbooks == alerts


def test_the_readme_enables_the_stripe_events_the_engine_applies():
    checklist = README[README.index("### Stripe checklist") :]
    enable = checklist[checklist.index("The events to enable") :].split("\n4.", 1)[0]
    assert set(re.findall(r"`(payment_intent\.\w+)`", enable)) == SETTLING_TYPES
    assert "/v1/gateway-events/stripe" in checklist


def test_the_readme_is_a_short_page_whose_links_exist():
    assert len(README.splitlines()) <= 200
    for linked in re.findall(r"\bdocs/[\w-]+\.md\b", README):
        assert (ROOT / linked).is_file(), linked


def test_the_procfile_variables_documented_by_hand_are_the_procfiles():
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    hand = configuration.split(docs.end("configuration"), 1)[1]
    documented = set(re.findall(r"^\| `(\w+)` \|", hand, re.MULTILINE))
    procfiles = (ROOT / "Procfile").read_text() + (ROOT / "Procfile.dev").read_text()
    assert documented == set(re.findall(r"\$\{(\w+)", procfiles))


def test_nothing_cites_a_document_outside_the_repository():
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.sql", "*.md", "*.html", "*.yml", "*.toml", "dev"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    cited = []
    for name in tracked:
        path = ROOT / name
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"SPEC\s*§|\bSPEC\.md\b|design\scard", line):
                cited.append(f"{name}:{number}")
    assert not cited, cited
