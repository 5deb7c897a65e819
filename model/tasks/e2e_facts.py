"""Which facts of an E2E MR a description states, leaves out, gets WRONG or makes up, and where.

e2e.py's mention check (unmentioned_attributes) asks only whether a text mentions each attribute:
"It is located in the city centre" for area[riverside] counted as "not area", and "It is cheap"
for priceRange[high] as stated. Here each closed attribute's values fall into classes of the same
meaning (cheap and less than £20; high and 5 out of 5), each found by its own cue words, so a text
that states another class of the attribute and not the MR's own is a WRONG fact:

* stated: the MR's value (or, for priceRange and customer rating, the attribute with a value these
  cues do not read) is in the text; name and near word for word;
* wrong: another value of the same attribute is, and the MR's own is not (both: stated);
* missing: neither;
* made up: an attribute the MR does not give is mentioned (e2e.added_attributes, the same check as
  the test-set figures' made-up share).

Cue words, like the E2E challenge's slot-error scripts: they miss paraphrases they do not list,
so a "missing" may be a fact stated in other words; the MR's own places are blanked out first
("Café Rouge" names a place, not a coffee shop). Each fact keeps the character span of the words
that state it, so the page can mark them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from model.tasks.e2e import added_attributes, parse_mr

STATES = ("wrong", "made up", "missing", "stated")  # worst first: the order the page lists them in

_PRICE_WORDS = r"(?:price|prices|priced|pricing|price range|cost|costs)"
_RATING_WORDS = r"(?:customer rating|rating|ratings|rated|reviews?)"
_FILLER = r"(?:very|really|a|an|so|suitable|welcoming|welcome|allowed|allow|allows|open|good|ideal|recommended|" \
          r"cater|caters|catering|friendly|for|to|the|with|at|all|kid|child|family)"
# Each closed attribute: value class -> (the MR values of that class, its cue pattern).
_CLASSES: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "eatType": {
        "coffee shop": (("coffee shop",), r"\bcoffee[ -]?shops?\b|\bcoffee\b|\bcaf[eé]s?\b"),
        "pub": (("pub",), r"\bpubs?\b"),
        "restaurant": (("restaurant",), r"\brestaurants?\b"),
    },
    "food": {value: ((value,), cue) for value, cue in (
        ("Chinese", r"\bchinese\b"), ("English", r"\benglish\b|\bbritish\b"), ("Fast food", r"\bfast[ -]?food"),
        ("French", r"\bfrench\b"), ("Indian", r"\bindian\b"), ("Italian", r"\bitalian\b"),
        ("Japanese", r"\bjapanese\b|\bsushi\b"))},
    "priceRange": {
        "low": (("cheap", "less than £20"),
                rf"\bcheap|\binexpensive|\blow[- ]?(?:cost|price|priced|prices)\b|\bbudget\b|\baffordabl|"
                rf"(?:less than|under|below) £ ?20\b|{_PRICE_WORDS} (?:is |are |of )?(?:very )?low\b"),
        "moderate": (("moderate", "£20-25"),
                     rf"\bmoderate|\bmid[- ]?(?:range|priced)|\baverage[- ]pric|£ ?20 ?(?:-|–|to) ?£? ?25|"
                     rf"{_PRICE_WORDS} (?:is |are |of )?(?:an? )?average\b"),
        "high": (("high", "more than £30"),
                 rf"\bexpensive|\bpricey|\bhigh[- ]?(?:cost|price|priced|prices|end)\b|\bpremium\b|"
                 rf"(?:more than|over|above) £ ?30|{_PRICE_WORDS} (?:is |are |of )?(?:very )?high\b"),
    },
    "customer rating": {
        "low": (("low", "1 out of 5"),
                rf"\b1 out of 5\b|\bone star|\b1[- ]star|\b(?:low|poor)(?:ly)?[- ]?(?:customer )?rat(?:ed|ing)|"
                rf"{_RATING_WORDS} (?:is |are |of )?(?:very )?(?:low|poor)\b"),
        "average": (("average", "3 out of 5"),
                    rf"\b3 out of 5\b|\bthree stars?|\b3[- ]stars?|\baverage(?:ly)?[- ]?(?:customer )?rat(?:ed|ing)|"
                    rf"{_RATING_WORDS} (?:is |are |of )?(?:an? )?average\b"),
        "high": (("high", "5 out of 5"),
                 rf"\b5 out of 5\b|\bfive stars?|\b5[- ]stars?|\b(?:high|excellent)(?:ly)?[- ]?(?:customer )?rat"
                 rf"(?:ed|ing)|\bwell[- ]rated|{_RATING_WORDS} (?:is |are |of )?(?:very )?(?:high|excellent)\b"),
    },
    "area": {
        "city centre": (("city centre",), r"\bcity[ -]?cent(?:re|er)\b|\bcent(?:re|er)\b|\bdowntown\b|\bcity\b"),
        "riverside": (("riverside",), r"\briver\w*"),
    },
    "familyFriendly": {
        "no": (("no",), rf"(?:\bnot|n't|\bnon|\bno)\b[- ]?(?:{_FILLER}[- ])*(?:famil|child|kid)\w*(?:[- ]friendly)?|\badults?[- ]only\b"),
        "yes": (("yes",), r"\bfamil\w*|\bchild\w*|\bkids?\b|\bkid[- ]friendly\b"),
    },
}
# The attribute named without a value these cues read: stated (the mention check counts it so too).
_ANY_MENTION = {"priceRange": r"\bpric\w*|\bcosts?\b|£\s?\d+", "customer rating": r"\brat(?:ed|ing|ings)\b|\bstars?\b"}
_MADE_UP_CUES = {**{attribute: "|".join([*(cue for _, cue in classes.values()), *filter(None, [_ANY_MENTION.get(attribute)])])
                    for attribute, classes in _CLASSES.items()}, "near": r"\bnear\b|\bnext to\b|\bclose to\b"}


@dataclass(frozen=True)
class Fact:
    """One attribute's verdict on one text: ``value`` the MR's ("" for a made-up one), ``said`` the
    words that state it or contradict it ("" when missing), ``span`` their (start, end) in the text."""

    attribute: str
    state: str  # one of STATES
    value: str
    said: str = ""
    span: tuple[int, int] | None = None


def _blank_places(text: str, mr: dict[str, str]) -> str:
    """``text`` with the MR's own places (whole words) overwritten by spaces (offsets kept)."""
    for place in (mr.get("name"), mr.get("near")):
        if place:
            text = re.sub(rf"(?<!\w){re.escape(place)}(?!\w)", lambda m: " " * len(m.group()), text,
                          flags=re.IGNORECASE)
    return text


def _class_of(attribute: str, value: str) -> str | None:
    return next((name for name, (values, _) in _CLASSES[attribute].items()
                 if value.lower() in (v.lower() for v in values)), None)


def _matches(pattern: str, text: str) -> list[re.Match[str]]:
    return list(re.finditer(pattern, text, flags=re.IGNORECASE))


def _family_matches(text: str) -> dict[str, list[re.Match[str]]]:
    """familyFriendly's "no" phrases, and the "yes" cues that lie outside every "no" phrase."""
    no = _matches(_CLASSES["familyFriendly"]["no"][1], text)
    yes = [m for m in _matches(_CLASSES["familyFriendly"]["yes"][1], text)
           if not any(n.start() <= m.start() < n.end() for n in no)]
    return {"no": no, "yes": yes}


def _closed_fact(attribute: str, value: str, text: str) -> Fact:
    own = _class_of(attribute, value)
    if attribute == "familyFriendly":
        found = _family_matches(text)
    else:
        found = {name: _matches(cue, text) for name, (_, cue) in _CLASSES[attribute].items()}
    if own is not None and found.get(own):
        match = found[own][0]
        return Fact(attribute, "stated", value, match.group(), match.span())
    other = next((matches[0] for name, matches in found.items() if name != own and matches), None)
    if other is not None:
        return Fact(attribute, "wrong", value, other.group(), other.span())
    loose = _matches(_ANY_MENTION[attribute], text) if attribute in _ANY_MENTION else []
    if loose:
        return Fact(attribute, "stated", value, loose[0].group(), loose[0].span())
    return Fact(attribute, "missing", value)


def _place_fact(attribute: str, value: str, text: str) -> Fact:
    start = text.lower().find(value.lower())
    if start < 0:
        return Fact(attribute, "missing", value)
    return Fact(attribute, "stated", value, text[start:start + len(value)], (start, start + len(value)))


def check_facts(mr: str, text: str) -> list[Fact]:
    """Each attribute of ``mr`` as stated / missing / wrong in ``text``, in the MR's order, then each
    made-up one (an attribute the MR does not give that the text mentions). A ValueError for an MR
    parse_mr refuses."""
    given = parse_mr(mr)
    blanked = _blank_places(text, given)
    facts = [_place_fact(attribute, value, text) if attribute not in _CLASSES
             else _closed_fact(attribute, value, blanked) for attribute, value in given.items()]
    for attribute in added_attributes(mr, text):
        match = next(iter(_matches(_MADE_UP_CUES.get(attribute, r"(?!)"), blanked)), None)
        facts.append(Fact(attribute, "made up", "", match.group() if match else "", match.span() if match else None))
    return facts


def worst_first(facts: Sequence[Fact]) -> list[Fact]:
    """``facts`` ordered wrong, made up, missing, stated (stable within each)."""
    return sorted(facts, key=lambda fact: STATES.index(fact.state))


def fact_counts(mrs: Sequence[str], texts: Sequence[str]) -> dict[str, float]:
    """Over a set of descriptions, the share that hold at least one wrong fact, one made up and one
    missing, and the share whose every fact is stated with nothing made up (each rounded to 3 places)."""
    counted = {"wrong": 0, "made up": 0, "missing": 0, "all right": 0}
    for mr, text in zip(mrs, texts):
        states = {fact.state for fact in check_facts(mr, text)}
        for state in ("wrong", "made up", "missing"):
            counted[state] += state in states
        counted["all right"] += states <= {"stated"}
    total = max(1, min(len(mrs), len(texts)))
    return {state: round(count / total, 3) for state, count in counted.items()}
