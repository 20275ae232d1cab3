"""The refusal catalogue: every refusal the code raises comes from it, and the runbook is it, rendered."""

import re
from pathlib import Path

import pytest

import {{ cookiecutter.package_name }}
from {{ cookiecutter.package_name }}.devtools.nemesis import (
    CHECKPOINT_LOST,
    MISMATCH,
    SOURCE_BEHIND,
    SOURCE_LOST,
    SOURCE_REWRITTEN,
    TABLE_AHEAD,
    refusals_found,
    way_out_of,
)
from {{ cookiecutter.package_name }}.pipeline.egress import installed_names
from {{ cookiecutter.package_name }}.pipeline.refusals import RUNBOOK_BEGIN, RUNBOOK_END, Refusal, runbook

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = Path({{ cookiecutter.package_name }}.__file__).parent


def test_the_runbooks_refusals_are_the_catalogue_rendered():
    text = (PROJECT / "docs" / "runbook.md").read_text()
    section = text[text.index(RUNBOOK_BEGIN) : text.index(RUNBOOK_END) + len(RUNBOOK_END)]

    # To bring the runbook up to date: replace that section with the output of runbook(installed_names()).
    assert section + "\n" == runbook(installed_names())


def test_every_refusal_this_project_can_meet_is_raised_from_the_catalogue():
    source = "\n".join(path.read_text() for path in PACKAGE.rglob("*.py") if path.name != "refusals.py")
    used = set(re.findall(r"Refusal\.([A-Z_]+)\.message", source))
    installed = set(installed_names())

    assert used == {refusal.name for refusal in Refusal if refusal.entry.applies_to(installed)}
    assert "Way out:" not in source, "a refusal written outside the catalogue"


def test_a_refusal_names_what_it_found_and_the_exact_way_out():
    message = Refusal.TABLE_AHEAD.message(
        "gold",
        table="gold_event_windows",
        path="/lake/gold_event_windows",
        batch=9,
        stream_id="6f1c",
        checkpoint="/lake/checkpoints/gold",
        progress="last planned batch 3, last committed batch 3",
    )

    assert message.startswith("gold: sink table gold_event_windows at /lake/gold_event_windows has committed batch 9")
    assert "Way out: `{{ cookiecutter.project_slug }} checkpoints reset gold` (it asks first" in message
    assert message.endswith("gold is rebuilt from silver beside the table and replaces its rows in one commit.")


def test_a_refusal_rendered_without_a_fact_it_needs_fails_loudly():
    with pytest.raises(ValueError, match=r"TABLE_AHEAD needs the facts \['batch', "):
        Refusal.TABLE_AHEAD.message("gold", table="gold_event_windows")


@pytest.mark.parametrize(
    "refusal, kind, way_out",
    [
        (Refusal.CHECKPOINT_LOST, CHECKPOINT_LOST, "checkpoints reset gold"),
        (Refusal.TABLE_AHEAD, TABLE_AHEAD, "checkpoints reset gold"),
        (Refusal.MISMATCH, MISMATCH, "checkpoints reset gold"),
        (Refusal.SOURCE_RECORDS_LOST, SOURCE_LOST, "checkpoints accept-loss"),
        (Refusal.SOURCE_BEHIND, SOURCE_BEHIND, "checkpoints reset gold"),
        (Refusal.SOURCE_REWRITTEN, SOURCE_REWRITTEN, "checkpoints reset gold"),
        (Refusal.EGRESS_SOURCE_BEHIND, SOURCE_BEHIND, "checkpoints reset gold"),
    ],
)
def test_the_nemesis_recognises_each_refusal_it_predicts_and_takes_the_way_out_it_names(refusal, kind, way_out):
    # The fault schedule (devtools/nemesis.py) reads refusals from the command line's output.
    named = {"reset", "reset_only", "rebuilds", "accept"}
    message = refusal.message("gold", **{name: f"<{name}>" for name in refusal.entry.fields() - named})
    output = f"a batch's log line\nconfig error\n{message}\n"

    assert refusals_found(output) == {kind}
    assert way_out_of(output) == way_out
