"""Facts per attribute (model/tasks/e2e_facts.py): stated, missing, WRONG, made up, and the span
that states each; the committed test-set table equals a fresh count."""

from __future__ import annotations

import json

import pytest

from model.tasks.e2e import reported_records
from model.tasks.e2e_facts import check_facts, fact_counts, worst_first
from tests.support import ROOT

# The run: 5x wrote "city centre" for area[riverside].
MR = ("name[The Golden Palace], eatType[coffee shop], food[Italian], priceRange[cheap], area[riverside], "
      "familyFriendly[yes], near[Café Rouge]")


def states(mr: str, text: str) -> dict[str, str]:
    return {fact.attribute: fact.state for fact in check_facts(mr, text)}


def test_a_contradicting_value_is_wrong_and_its_span_names_it() -> None:
    text = ("The Golden Palace is a cheap Italian coffee shop near Café Rouge. It is located in the city centre "
            "and is family friendly.")
    facts = {fact.attribute: fact for fact in check_facts(MR, text)}
    assert facts["area"].state == "wrong"
    start, end = facts["area"].span
    assert text[start:end] == "city centre" == facts["area"].said
    assert {a: f.state for a, f in facts.items() if a != "area"} == dict.fromkeys(
        ("name", "eatType", "food", "priceRange", "familyFriendly", "near"), "stated")


def test_the_right_value_is_stated_and_a_silent_attribute_missing() -> None:
    text = "The Golden Palace is an Italian coffee shop by the riverside near Café Rouge."
    assert states(MR, text) == {"name": "stated", "eatType": "stated", "food": "stated", "priceRange": "missing",
                                "area": "stated", "familyFriendly": "missing", "near": "stated"}


@pytest.mark.parametrize(("mr", "text", "attribute", "state"), [
    ("name[Aromi], familyFriendly[yes]", "Aromi is not kid friendly.", "familyFriendly", "wrong"),
    ("name[Aromi], familyFriendly[no]", "Aromi is not kid friendly.", "familyFriendly", "stated"),
    ("name[Aromi], familyFriendly[no]", "Aromi welcomes families.", "familyFriendly", "wrong"),
    ("name[Aromi], priceRange[high]", "Aromi is cheap.", "priceRange", "wrong"),
    ("name[Aromi], priceRange[more than £30]", "Aromi is expensive.", "priceRange", "stated"),
    ("name[Aromi], priceRange[high]", "Aromi has a price range.", "priceRange", "stated"),  # named, value unread
    ("name[Aromi], customer rating[1 out of 5]", "Aromi has a high customer rating.", "customer rating", "wrong"),
    ("name[Aromi], customer rating[average]", "Aromi is rated 3 out of 5.", "customer rating", "stated"),
    ("name[Aromi], eatType[pub]", "Aromi is a restaurant.", "eatType", "wrong"),
    ("name[Aromi], eatType[pub], near[Café Rouge]", "Aromi is near Café Rouge.", "eatType", "missing"),  # a place's word
    ("name[Aromi], food[French]", "Aromi serves Italian food.", "food", "wrong"),
])
def test_each_closed_attribute(mr: str, text: str, attribute: str, state: str) -> None:
    assert states(mr, text)[attribute] == state


def test_made_up_facts_come_after_the_mrs_own_with_their_words() -> None:
    facts = check_facts("name[Aromi], food[French]", "Aromi serves French food and has a 5 out of 5 customer rating.")
    made_up = [fact for fact in facts if fact.state == "made up"]
    assert [(fact.attribute, fact.said) for fact in made_up] == [("customer rating", "5 out of 5")]
    assert facts[-1] is made_up[0]
    assert [fact.state for fact in worst_first(facts)] == ["made up", "stated", "stated"]


def test_fact_counts_share_per_kind() -> None:
    mrs = ["name[Aromi], area[riverside]"] * 4
    texts = ["Aromi is by the river.", "Aromi is in the city centre.", "Aromi.", "Aromi is by the river, near B."]
    assert fact_counts(mrs, texts) == {"wrong": 0.25, "made up": 0.25, "missing": 0.25, "all right": 0.25}


def test_the_committed_table_is_a_fresh_count() -> None:
    """assets/eval/e2e-facts.json (scripts/e2e_facts_table.py --write) for one arm, recounted."""
    committed = json.loads((ROOT / "assets" / "eval" / "e2e-facts.json").read_text())
    rows = [json.loads(line) for line in (ROOT / "assets" / "eval" / "e2e-delexicalised-outputs.jsonl").open()]
    arm = next(row for row in rows if row["label"] == "per-speedup policy 5x")
    mrs = [record.mr for record in reported_records()][: len(arm["outputs"])]
    assert committed["e2e-delexicalised"]["per-speedup policy 5x"] == fact_counts(mrs, arm["outputs"])
