"""The E2E NLG task (the SkipDecode paper's first task): a restaurant's meaning representation
(MR, e.g. ``name[The Eagle], food[French]``) in, a one- or two-sentence description out.

Data: assets/data/e2e/ holds the challenge's devset.csv and testset_w_refs.csv (CC BY-SA 4.0,
README beside them). The official 42k training set is not available offline, so the task
model and its skip policies train on devset.csv less HELDOUT_MRS of its MRs (held out to pick
between runs) and are reported on the test set only; ``assert_no_test_mr`` guards that.
"""

from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Collection, Iterable, Sequence

E2E_DATA = Path(__file__).resolve().parents[2] / "assets" / "data" / "e2e"
DEV_FILE = "devset.csv"
TEST_FILE = "testset_w_refs.csv"
HELDOUT_MRS = 50
HELDOUT_SEED = 0

# The eight attributes in the order the challenge's MRs list them (the playground's form too).
ATTRIBUTES = ("name", "eatType", "food", "priceRange", "customer rating", "area", "familyFriendly", "near")
# Values seen in the challenge's data for the closed attributes (name and near are free text).
ATTRIBUTE_VALUES = {
    "eatType": ("coffee shop", "pub", "restaurant"),
    "food": ("Chinese", "English", "Fast food", "French", "Indian", "Italian", "Japanese"),
    "priceRange": ("cheap", "moderate", "high", "less than £20", "£20-25", "more than £30"),
    "customer rating": ("low", "average", "high", "1 out of 5", "3 out of 5", "5 out of 5"),
    "area": ("city centre", "riverside"),
    "familyFriendly": ("yes", "no"),
}
# Each optional attribute's chance of being in a synthetic MR (synthetic_mrs). 0.75 makes most MRs
# long; 0.5 makes every subset of the optional attributes equally likely, so a policy also learns
# to stop where an MR gives few facts (a 3x policy at its floor appended a made-up customer rating
# where the MR gave none: the devset's MRs give a rating in 88% of cases, the 0.75 draws in 76%).
SYNTHETIC_ATTRIBUTE_SHARE = 0.75
# Places invented for this project: neither the devset's nor the test set's (tested). The test set
# asks about restaurants the devset never names, which a skip policy must copy from the prompt; a
# policy distilled only on the devset's 30 places learns those instead. The held-out ones judge a
# policy on places no training data has (lab/training/task_heldout_curve.py --long N --invented-places).
INVENTED_PLACES_HELDOUT = ("The Copper Kettle", "Silver Heron", "The Old Granary", "Harbour Lights",
                           "The Velvet Fig", "Juniper Hall", "The Gilded Pear", "Kingfisher Rooms",
                           "Tamarind Corner", "The Wandering Goose")
# Invented places a policy may train on (train-task --invented-places): "The <adjective> <noun>",
# no word shared with the held-out ones above, none a devset or test place (tested).
_INVENTED_ADJECTIVES = ("Amber", "Cedar", "Coral", "Dappled", "Emerald", "Hazel", "Ivory", "Jade",
                        "Maple", "Misty", "Rustic", "Scarlet", "Saffron", "Sunlit", "Thatched", "Wild")
_INVENTED_NOUNS = ("Lantern", "Anchor", "Orchard", "Meadow", "Thistle", "Badger", "Lark", "Acorn",
                   "Barrel", "Compass", "Otter", "Quill", "Spoon", "Willow", "Wren", "Bramble")
INVENTED_PLACES_TRAINING = tuple(f"The {adjective} {noun}" for adjective in _INVENTED_ADJECTIVES for noun in _INVENTED_NOUNS)
INVENTED_STYLES = ("fixed", "varied")  # train-task --invented-style: the 256 names above, or varied_places
# Words and made-up words for varied_places. Why a second kind: a policy trained on the 256 names
# above can learn their 32 words instead of copying (it names 22 of 100 held-out invented places, the
# task model 96); the test set's places are of every shape ("Rainbow Vegetarian Café", "All Bar One",
# "Zizzi"), and a name drawn afresh for nearly every MR can only be copied.
_VARIED_WORDS = ("Blue", "Stone", "Bridge", "Garden", "Fox", "Crown", "Oak", "River", "Moon", "Golden",
                 "Red", "Green", "Little", "Grand", "Royal", "North", "Market", "Castle", "Mill", "Tower",
                 "Rose", "Bell", "Swan", "Bear", "Lion", "Eagle", "Star", "Sun", "Harvest", "Pepper",
                 "Olive", "Lemon", "Ginger", "Basil", "Honey", "Salt", "Smoke", "Fire", "Iron", "Brick",
                 "Cobble", "Lantern", "Harbor", "Dock", "Pier", "Quay", "Orchid", "Lotus", "Bamboo", "Tiger",
                 "Dragon", "Panda", "Mango", "Spice", "Saffron", "Curry", "Noodle", "Dumpling", "Sushi", "Wasabi",
                 "Bistro", "Vine", "Cellar", "Barn", "Cottage", "Chapel", "Abbey", "Meadow", "Valley", "Hill")
_VARIED_SUFFIXES = ("Kitchen", "House", "Tavern", "Grill", "Bistro", "Inn", "Café", "Bar", "Diner", "Lounge",
                    "Brasserie", "Trattoria", "Arms", "Canteen", "Eatery", "Express", "Hotel", "Plaza")
_SYLLABLE_ONSETS = ("b", "br", "c", "ch", "d", "f", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "r", "s",
                    "sh", "st", "t", "tr", "v", "w", "z")
_SYLLABLE_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io")
_SYLLABLE_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "tt")


def _made_up_word(rng: random.Random) -> str:
    """A pronounceable made-up word of two or three syllables ("Brovanti", "Kelmora")."""
    syllables = rng.choice((2, 2, 3))
    return "".join(rng.choice(_SYLLABLE_ONSETS) + rng.choice(_SYLLABLE_VOWELS) + rng.choice(_SYLLABLE_CODAS)
                   for _ in range(syllables)).capitalize()


def _varied_place(rng: random.Random) -> str:
    """One place name in one of the shapes real ones take: "The Olive Lantern", "Brovanti Kitchen",
    "Zelmai", "The Fox and Bell", "Kelmora Garden", "Golden Dragon Express"."""
    first, second = rng.sample(_VARIED_WORDS, 2)
    shape = rng.randrange(6)
    if shape == 0:
        return f"The {first} {second}"
    if shape == 1:
        return f"{_made_up_word(rng)} {rng.choice(_VARIED_SUFFIXES)}"
    if shape == 2:
        return _made_up_word(rng)
    if shape == 3:
        return f"The {first} and {second}"
    if shape == 4:
        return f"{_made_up_word(rng)} {first}"
    return f"{first} {second} {rng.choice(_VARIED_SUFFIXES)}"


def varied_places(count: int, seed: int = 0, avoid: Iterable[str] = ()) -> tuple[str, ...]:
    """``count`` distinct invented place names of varied shapes (_varied_place), none sharing a word
    with INVENTED_PLACES_HELDOUT and none containing or contained in a place of ``avoid`` (the
    devset's and test set's: the caller passes them, so that no training place is a test place)."""
    held_words = {word.lower() for place in INVENTED_PLACES_HELDOUT for word in place.split() if word != "The"}
    avoided = [place.lower() for place in avoid]
    rng = random.Random(seed)
    made: dict[str, None] = {}
    for _ in range(100 * count):  # bounded: a small shape space cannot loop forever
        if len(made) == count:
            break
        place = _varied_place(rng)
        lowered = place.lower()
        if (held_words & set(lowered.split()) or place in made
                or any(real in lowered or lowered in real for real in avoided)):
            continue
        made[place] = None
    return tuple(made)


MAX_VALUE_CHARS = 60  # a restaurant's or landmark's name; longer is not an MR
# The longest MR: eight pairs of the longest attribute name, a value at MAX_VALUE_CHARS and room for
# spaces. Anything longer is refused before it is read, so no caller pays for a pasted novel.
MAX_MR_CHARS = 8 * (len("customer rating") + MAX_VALUE_CHARS + 16)

# The fixed prompt around an MR (through the model's chat template). One wording for training,
# evaluation, the CLI and the playground: a different wording is a different task.
INSTRUCTION = "Write a short restaurant description that states every fact in this meaning representation: "


@dataclass(frozen=True)
class E2ERecord:
    """One MR with every human reference written for it."""

    mr: str
    references: tuple[str, ...]


def task_prompt(mr: str) -> str:
    """The user message the task model sees for ``mr`` (the chat template goes around it)."""
    return INSTRUCTION + mr


def read_split(name: str, folder: Path = E2E_DATA) -> list[E2ERecord]:
    """The MRs of one CSV file in first-seen order, each with all its references."""
    path = Path(folder) / name
    if not path.is_file():
        raise ValueError(f"E2E data file {path} does not exist")
    grouped: dict[str, list[str]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            grouped.setdefault(row["mr"].strip(), []).append(row["ref"].strip())
    return [E2ERecord(mr, tuple(refs)) for mr, refs in grouped.items()]


def dev_split(folder: Path = E2E_DATA) -> tuple[list[E2ERecord], list[E2ERecord]]:
    """devset.csv's MRs as (train, held-out): HELDOUT_MRS MRs drawn with a fixed seed."""
    records = read_split(DEV_FILE, folder)
    order = list(range(len(records)))
    random.Random(HELDOUT_SEED).shuffle(order)
    held = set(order[:HELDOUT_MRS])
    return ([r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held])


def reported_records(folder: Path = E2E_DATA) -> list[E2ERecord]:
    """The 630 test MRs: for reporting only, never trained on."""
    return read_split(TEST_FILE, folder)


def normalise_mr(mr: str) -> str:
    """An MR's canonical form for comparisons: its pairs sorted, spaces squeezed."""
    return ", ".join(f"{k}[{v}]" for k, v in sorted(parse_mr(mr).items()))


def known_mrs(folder: Path = E2E_DATA) -> set[str]:
    """Every devset and test MR, normalised: what a made-up MR (synthetic, relexicalised) must not be."""
    return {normalise_mr(r.mr) for r in (*read_split(DEV_FILE, folder), *reported_records(folder))}


def assert_no_test_mr(mrs: Sequence[str], folder: Path = E2E_DATA) -> None:
    """Raise if any of ``mrs`` is a test-set MR (in any attribute order)."""
    test = {normalise_mr(r.mr) for r in reported_records(folder)}
    leaked = [mr for mr in mrs if normalise_mr(mr) in test]
    if leaked:
        raise ValueError(f"{len(leaked)} test-set MRs in training data, e.g. {leaked[0]!r}")


# --- Relexicalised copies (value substitution) ---------------------------------------------------
# The devset's MRs are all coffee shops serving Chinese or English food; the test set's are mostly
# pubs and restaurants, across seven cuisines. A reference that names its MR's eatType or food in
# the usual words is rewritten for another value (the MR with it), so the task model sees the
# values it will be asked for. A reference that words a value otherwise ("a café", "British food")
# cannot be rewritten safely and is left out of that copy.
_EAT_TYPE = re.compile(r"\b(?:(an?|An?) +)?(coffee[ -]shop)(s?)\b", re.IGNORECASE)
_VOWEL_VALUES = ("English", "Indian", "Italian")  # the values that take "an"
_FOOD_NOUNS = r"(?: +(?:food|foods|cuisine))?"


def _article(article: str | None, word: str) -> str:
    """``article`` ("a"/"an", any case, or None) made right for ``word``, with its trailing space."""
    if not article:
        return ""
    right = "an" if word.startswith(_VOWEL_VALUES) else "a"
    return (right.capitalize() if article[0].isupper() else right) + " "


def _sentence_case(text: str, start: int, word: str) -> str:
    """``word`` capitalised where it starts ``text`` or a sentence (a lower-case value such as "fast food")."""
    before = text[:start].rstrip()
    return word[0].upper() + word[1:] if not before or before.endswith((".", "!", "?")) else word


def _substitute(pattern: re.Pattern, reference: str, word_for: Callable[[re.Match], str]) -> str | None:
    """Every match of ``pattern`` (group 1: an optional article) -> ``word_for(match)``, the article
    made right for the new word and a sentence-initial word capitalised; None without a match."""
    if not pattern.search(reference):
        return None

    def swap(match: re.Match) -> str:
        word = word_for(match)
        word = _sentence_case(reference, match.start(), word) if not match.group(1) else word
        return _article(match.group(1), word) + word
    return pattern.sub(swap, reference)


def _replace_eat_type(reference: str, new: str) -> str | None:
    """"coffee shop" -> ``new`` ("pub", "restaurant"), with the article and plural kept right; None
    where the reference does not say "coffee shop"."""
    return _substitute(_EAT_TYPE, reference, lambda match: new + match.group(3))


def _replace_food(reference: str, old: str, new: str) -> str | None:
    """The cuisine ``old`` -> ``new`` ("Chinese food" -> "Italian food"; "Fast food" reads "fast food",
    never "fast food food"), the article kept right; None where the reference does not name ``old``."""
    pattern = re.compile(rf"\b(?:(an?|An?) +)?({re.escape(old)}){_FOOD_NOUNS}\b" if new == "Fast food"
                         else rf"\b(?:(an?|An?) +)?({re.escape(old)})\b")
    word = "fast food" if new == "Fast food" else new
    return _substitute(pattern, reference, lambda match: word)


def _still_says(reference: str, mr: dict[str, str], words: tuple[str, ...]) -> bool:
    """Whether ``reference`` still uses one of ``words`` outside the MR's own names (a place called
    "Café Sicilia" is a name, "a café" is the old eatType left behind)."""
    text = reference.lower()
    for key in ("name", "near"):
        if key in mr:
            text = text.replace(mr[key].lower(), " ")
    return any(word in text for word in words)


def relexicalise(record: E2ERecord, eat_type: str | None, food: str | None) -> E2ERecord | None:
    """``record`` with its eatType and/or food replaced (None: kept) in the MR and in every reference
    that words them as the challenge's values; None when no reference can be rewritten."""
    pairs = parse_mr(record.mr)
    new_values = {key: value for key, value in (("eatType", eat_type), ("food", food)) if value is not None}
    for key in new_values:
        if key not in pairs:
            raise ValueError(f"relexicalise: the MR has no {key} to replace")
    mr = ", ".join(f"{key}[{new_values.get(key, value)}]" for key, value in pairs.items())  # the MR's own order
    if eat_type is not None and pairs["eatType"] not in (eat_type, "coffee shop"):
        return None  # only the devset's coffee shops are worded predictably enough
    references = [text for text in (_rewrite(reference, pairs, eat_type, food) for reference in record.references)
                  if text is not None]
    return E2ERecord(mr, tuple(references)) if references else None


def _rewrite(reference: str, pairs: dict[str, str], eat_type: str | None, food: str | None) -> str | None:
    """One reference with the MR's eatType and food replaced; None where it words either otherwise."""
    text = reference
    if eat_type is not None and pairs["eatType"] != eat_type:
        rewritten = _replace_eat_type(text, eat_type)
        if rewritten is None or _still_says(rewritten, pairs, ("coffee", "café", "cafe")):
            return None
        text = rewritten
    if food is not None and pairs["food"] != food:
        rewritten = _replace_food(text, pairs["food"], food)
        if rewritten is None or _still_says(rewritten, pairs, (pairs["food"].lower(),)):
            return None
        text = rewritten
    return text


def relexicalised_records(records: Sequence[E2ERecord], copies: int, seed: int = 0,
                          folder: Path = E2E_DATA) -> list[E2ERecord]:
    """Up to ``copies`` rewritten copies of each record (eatType and food drawn anew from the other
    closed values, where the MR has them), skipping any copy whose MR is a devset or test MR."""
    if not 0 <= copies <= 20:
        raise ValueError(f"relexicalised copies per MR must be in [0, 20]; got {copies}")
    taken = known_mrs(folder)
    rng = random.Random(seed)
    made: list[E2ERecord] = []
    for record in records:
        pairs = parse_mr(record.mr)
        if "eatType" not in pairs and "food" not in pairs:
            continue
        for _ in range(copies):
            eat_type = rng.choice([v for v in ATTRIBUTE_VALUES["eatType"] if v != pairs["eatType"]]) if "eatType" in pairs else None
            food = rng.choice([v for v in ATTRIBUTE_VALUES["food"] if v != pairs["food"]]) if "food" in pairs else None
            copy = relexicalise(record, eat_type, food)
            if copy is None:
                continue
            key = normalise_mr(copy.mr)
            if key not in taken:
                taken.add(key)
                made.append(copy)
    return made


def training_rows(records: Sequence[E2ERecord]) -> list[dict]:
    """prompt/completion records (model/data.py user_examples): one per (MR, reference)."""
    return [{"prompt": task_prompt(r.mr), "completion": ref} for r in records for ref in r.references]


def complete_references(records: Sequence[E2ERecord]) -> list[E2ERecord]:
    """Each record with only the references that mention every fact of its MR
    (unmentioned_attributes); a record none of whose references does keeps them all, so no MR is lost.
    Why: greedy decoding learns the likeliest wording, and in the devset that is often an
    annotator's template that leaves a fact out ("X is a pub providing Chinese food It is located in
    the riverside. It is near Y." for a family-friendly pub): the E2E cleaning idea, as a filter."""
    kept = []
    for record in records:
        complete = tuple(ref for ref in record.references if not unmentioned_attributes(record.mr, ref))
        kept.append(E2ERecord(record.mr, complete or record.references))
    return kept


def write_training_file(path: str | Path, folder: Path = E2E_DATA, relexicalised: int = 0, seed: int = 0,
                        complete_only: bool = False) -> Path:
    """The training references as JSONL (devset less the held-out MRs, and ``relexicalised`` rewritten
    copies of each; ``complete_only``: only those that mention every fact, complete_references),
    checked against the test set."""
    train, _ = dev_split(folder)
    train = [*train, *relexicalised_records(train, relexicalised, seed, folder)]
    train = complete_references(train) if complete_only else train
    assert_no_test_mr([r.mr for r in train], folder)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in training_rows(train):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


# --- MRs a visitor writes ------------------------------------------------------------------------


def parse_mr(text: str) -> dict[str, str]:
    """``name[X], food[Y]`` -> {"name": "X", "food": "Y"}; a clear ValueError for anything else:
    unknown attributes, repeated ones, empty or overlong values, text outside the brackets.

    Read in one pass with str.find (no regular expression: a pattern whose key and spaces could
    match a run of spaces two ways took the square of its length to fail), after a length cap, so
    any text costs time linear in at most MAX_MR_CHARS characters."""
    if isinstance(text, str) and len(text) > MAX_MR_CHARS:
        raise ValueError(f"the MR is {len(text)} characters; an MR of all eight attributes fits in {MAX_MR_CHARS}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the MR is empty: write it as name[The Eagle], food[French], ...")
    pairs: dict[str, str] = {}
    position, text = 0, text.strip()
    while position < len(text):
        key, value, position = _next_pair(text, position)
        if key not in ATTRIBUTES:
            raise ValueError(f"unknown MR attribute {key[:30]!r}: use {', '.join(ATTRIBUTES)}")
        if key in pairs:
            raise ValueError(f"the MR names {key} twice")
        if not value or len(value) > MAX_VALUE_CHARS:
            raise ValueError(f"{key}[...] needs a value of 1 to {MAX_VALUE_CHARS} characters")
        pairs[key] = value
    if "name" not in pairs:
        raise ValueError("the MR needs a name[...]")
    return pairs


def _next_pair(text: str, position: int) -> tuple[str, str, int]:
    """The pair ``key[value]`` that starts at ``position`` (spaces around it and one comma after it
    allowed) -> (key, value, where the next pair starts). The key is letters and inner spaces, the
    value holds no bracket."""
    opening = text.find("[", position)
    closing = text.find("]", opening + 1) if opening >= 0 else -1
    key = text[position:opening].strip() if opening >= 0 else ""
    after = closing + 1
    while after < len(text) and text[after].isspace():
        after += 1
    well_formed = (closing >= 0 and "[" not in text[opening + 1:closing] and key[:1].isascii() and key[:1].isalpha()
                   and all(c == " " or (c.isascii() and c.isalpha()) for c in key)
                   and (after == len(text) or text[after] == ","))
    if not well_formed:
        raise ValueError(f"the MR is not a list of attribute[value] pairs near {text[position:position + 20]!r}")
    return key, text[opening + 1:closing].strip(), after + 1


def compose_mr(values: dict[str, str | None]) -> str:
    """The form's fields -> an MR in the challenge's attribute order (empty fields left out),
    checked by parse_mr."""
    unknown = sorted(set(values) - set(ATTRIBUTES))
    if unknown:
        raise ValueError(f"unknown MR attribute {unknown[0]!r}")
    mr = ", ".join(f"{key}[{str(values[key]).strip()}]" for key in ATTRIBUTES
                   if values.get(key) is not None and str(values[key]).strip())
    parse_mr(mr)
    return mr


def place_names(records: Sequence[E2ERecord]) -> set[str]:
    """Every place the records' MRs name, as a name or as a near place."""
    return {value for r in records for key, value in parse_mr(r.mr).items() if key in ("name", "near")}


def synthetic_mrs(records: Sequence[E2ERecord], count: int, seed: int = 0,
                  attribute_share: float = SYNTHETIC_ATTRIBUTE_SHARE,
                  folder: Path = E2E_DATA) -> list[str]:
    """``count`` new MRs for distillation targets (they have no references): a name and a ``near``
    drawn from the names ``records`` use (either role), each other attribute present with
    probability ``attribute_share`` and its value drawn from the challenge's closed values
    (ATTRIBUTE_VALUES: the playground form's, pubs and restaurants and all seven cuisines, which
    the devset alone never shows). None is one of ``records``, a held-out or a test MR."""
    places = sorted(place_names(records))
    if len(places) < 2:
        raise ValueError("synthetic MRs need at least two place names in the records")
    taken = known_mrs(folder) | {normalise_mr(r.mr) for r in records}
    rng = random.Random(seed)
    made: list[str] = []
    for _ in range(100 * count):  # a bounded number of draws: a tiny vocabulary cannot loop forever
        if len(made) == count:
            break
        name, near = rng.sample(places, 2)
        values: dict[str, str | None] = {"name": name}
        for key, options in ATTRIBUTE_VALUES.items():
            values[key] = rng.choice(options) if rng.random() < attribute_share else None
        values["near"] = near if rng.random() < attribute_share else None
        mr = compose_mr(values)
        key = normalise_mr(mr)
        if key not in taken:
            taken.add(key)
            made.append(mr)
    if len(made) < count:
        raise ValueError(f"only {len(made)} distinct new MRs can be composed from these records, not {count}")
    return made


def real_places(folder: Path = E2E_DATA) -> set[str]:
    """Every place a devset or test MR names: what an invented place must not be."""
    return place_names([*read_split(DEV_FILE, folder), *reported_records(folder)])


# Delexicalised places, the E2E challenge baseline's (TGen's) way: a place the model never trained
# on is swapped for one it knows before decoding and swapped back in the text after. Why: a third of
# the test MRs are near a place the devset never names, and copying a new name from the prompt is
# what a skip policy's few late layers do worst ("Tamarind Corner" -> "Tamor"). A known place of the
# same shape ("The ..." or not), never one the MR already names.
SURROGATE_PLACES = {True: ("The Eagle", "The Punter", "The Phoenix"), False: ("Aromi", "Cotto", "Wildwood")}


@dataclass(frozen=True)
class PlaceSwap:
    """An MR with its unknown places swapped for known ones, and how to swap them back."""

    mr: str  # what the models are given
    swaps: tuple[tuple[str, str], ...] = ()  # (surrogate, original place)
    original: str | None = None  # the MR as written, where anything was swapped

    @property
    def as_written(self) -> str:
        return self.mr if self.original is None else self.original


def _words(place: str) -> set[str]:
    return set(re.findall(r"\w+", place.lower()))


def delexicalise_places(mr: str, known: Collection[str]) -> PlaceSwap:
    """``mr`` with each name/near place not in ``known`` replaced by a surrogate (SURROGATE_PLACES)
    that shares no word with a place the MR names, so that writing back can never meet a place
    already written back; a place left as it is when no surrogate fits. The other pairs and their
    order unchanged."""
    pairs = parse_mr(mr)
    named = [pairs[key] for key in ("name", "near") if key in pairs]
    taken = set().union(*(_words(place) for place in named)) if named else set()
    swaps = []
    for key in ("name", "near"):
        place = pairs.get(key)
        if place is None or place in known:
            continue
        surrogate = next((s for s in SURROGATE_PLACES[place.startswith("The ")]
                          if not (_words(s) - {"the"}) & taken), None)
        if surrogate is None:
            continue
        taken |= _words(surrogate)
        swaps.append((surrogate, place))
        pairs[key] = surrogate
    if not swaps:
        return PlaceSwap(mr)
    return PlaceSwap(", ".join(f"{key}[{value}]" for key, value in pairs.items()), tuple(swaps), original=mr)


def place_swaps(mrs: Sequence[str], known: Collection[str] | None) -> list[PlaceSwap]:
    """Each MR delexicalised against ``known`` places, or (None) as it is."""
    return [delexicalise_places(mr, known) if known is not None else PlaceSwap(mr) for mr in mrs]


@lru_cache(maxsize=4)
def training_places(folder: Path = E2E_DATA) -> frozenset[str]:
    """The places the task model and its policies trained on (the training split's): every other
    place is delexicalised where asked (the playground's E2E task, eval-task --delexicalised-places)."""
    return frozenset(place_names(dev_split(folder)[0]))


def _keeps_article(surrogate: str, place: str) -> bool:
    """A "The ..." surrogate for a "The ..." place: either case of the article is the place's."""
    return surrogate.startswith("The ") and place.startswith("The ")


def _surrogates_pattern(swaps: Sequence[tuple[str, str]]) -> re.Pattern:
    """Where a description writes any of the surrogates: whole words, and for a "The ..." pair either
    case of the article (a sentence-inner "the Eagle"), one alternative (group) per swap."""
    parts = [(r"\b[Tt]he " + re.escape(surrogate[4:]) if _keeps_article(surrogate, place)
              else r"\b" + re.escape(surrogate)) + r"\b" for surrogate, place in swaps]
    return re.compile("|".join(f"({part})" for part in parts))


def restore_places(text: str, swaps: Sequence[tuple[str, str]]) -> str:
    """A description of a delexicalised MR with each surrogate written back as the original place,
    in one pass (a place written back is never searched again); a sentence-inner "the Eagle" keeps
    its lower-case article: "the Vaults"."""
    if not swaps:
        return text

    def write(match: re.Match[str]) -> str:
        surrogate, place = swaps[match.lastindex - 1]  # type: ignore[operator]
        return match.group(0)[0] + place[1:] if _keeps_article(surrogate, place) else place

    return _surrogates_pattern(swaps).sub(write, text)


def surrogate_spans(text: str, swaps: Sequence[tuple[str, str]]) -> list[tuple[int, int]]:
    """The character spans of ``text`` where restore_places writes a place back, in order."""
    return [m.span() for m in _surrogates_pattern(swaps).finditer(text)] if swaps else []


# --- Facts a description mentions (a cue-word check, as E2E slot-error scripts do) ---------------
# Whether a text MENTIONS each attribute of its MR, not whether it states the value rightly: a
# name or near place word for word, an eatType or food by its words, the others by any word of
# their kind ("priced", "rating", "river", "children"). The E2E challenge's devset has annotators
# who left facts out; a model trained on them can learn the omission as the likeliest wording.
_MENTION_CUES: dict[str, str | dict[str, str]] = {
    "eatType": {"coffee shop": r"coffee|caf[eé]", "pub": r"\bpubs?\b", "restaurant": r"restaurant"},
    "food": {"Chinese": r"chinese", "English": r"english|british", "Fast food": r"fast[ -]?food",
             "French": r"french", "Indian": r"indian", "Italian": r"italian", "Japanese": r"japanese|sushi"},
    "priceRange": r"pric|cheap|expensive|afford|cost|£|moderate|budget|\bvalue\b",
    "customer rating": r"rat(ed|ing|es)|stars?\b|review|score",
    "area": {"city centre": r"cent(re|er)|city|downtown", "riverside": r"river"},
    "familyFriendly": r"famil|child|kid",
}


def unmentioned_attributes(mr: str, text: str) -> list[str]:
    """The attributes of ``mr`` (in its order) that ``text`` never mentions (_MENTION_CUES)."""
    lowered = text.lower()
    missing = []
    for attribute, value in parse_mr(mr).items():
        cue = _MENTION_CUES.get(attribute)
        if cue is None:  # name, near: the place itself
            found = value.lower() in lowered
        else:
            pattern = cue.get(value, re.escape(value.lower())) if isinstance(cue, dict) else cue
            found = re.search(pattern, lowered) is not None
        if not found:
            missing.append(attribute)
    return missing


def _any_value_cue(attribute: str) -> str:
    """The cue for any value of ``attribute`` (a made-up fact may state any)."""
    cue = _MENTION_CUES[attribute]
    return "|".join(cue.values()) if isinstance(cue, dict) else cue


_ADDED_CUES: dict[str, str] = {
    **{attribute: _any_value_cue(attribute) for attribute in _MENTION_CUES},
    "near": r"\bnear\b|\bnext to\b|\bclose to\b",
}


def added_attributes(mr: str, text: str) -> list[str]:
    """The attributes ``mr`` does NOT give that ``text`` mentions anyway (a fact made up: the other
    half of an E2E slot error), by the same cue words, once the MR's own places are taken out of the
    text ("Café Sicilia" names a near place, not an eatType). In _ADDED_CUES' order."""
    given = parse_mr(mr)
    lowered = text.lower()
    for place in (given.get("name"), given.get("near")):
        if place:
            lowered = lowered.replace(place.lower(), " ")
    return [attribute for attribute, cue in _ADDED_CUES.items()
            if attribute not in given and re.search(cue, lowered) is not None]


def place_records(places: Sequence[str]) -> list[E2ERecord]:
    """Reference-less records that name ``places`` (each as a name and as a near place), so that
    synthetic_mrs draws its names from them: MRs about places no devset record names."""
    return [E2ERecord(f"name[{a}], near[{b}]", ()) for a, b in zip(places, [*places[1:], places[0]])]


def long_heldout_mrs(records: Sequence[E2ERecord], count: int, seed: int, trained_seed: int = 0,
                     trained_cap: int = 20000, places: Sequence[str] = (), folder: Path = E2E_DATA) -> list[str]:
    """``count`` new MRs naming all eight attributes, for judging a policy where the test set is
    hardest (41% of its MRs name all eight, 13% of the devset's). Their name and near place come
    from ``records``, and then none is one of the synthetic MRs a run with ``trained_seed`` trains on
    (heldout_new_mrs); or from ``places`` that no training data names (INVENTED_PLACES_HELDOUT),
    where no trained MR can be drawn. None is a devset or test MR."""
    if places:  # no synthetic MR a run trains on names these places: nothing to leave out
        return synthetic_mrs(place_records(places), count, seed, attribute_share=1.0, folder=folder)
    return heldout_new_mrs(records, count, seed, 1.0, trained_seed, trained_cap, folder=folder)


def heldout_new_mrs(records: Sequence[E2ERecord], count: int, seed: int, attribute_share: float,
                    trained_seed: int = 0, trained_cap: int = 20000,
                    trained_shares: Sequence[float] = (SYNTHETIC_ATTRIBUTE_SHARE,), folder: Path = E2E_DATA) -> list[str]:
    """``count`` new MRs drawn like synthetic ones (each optional attribute with probability
    ``attribute_share``), none of them a synthetic MR that a run with ``trained_seed`` and one of
    ``trained_shares`` trains on (any ``--synthetic-mrs`` up to the cap: synthetic_mrs draws the
    same sequence for a seed and share, whatever the count), nor a devset or test MR.
    ``attribute_share`` 0.5 gives MRs with few facts, where a policy must stop early."""
    trained: set[str] = set()
    for share in trained_shares:
        trained |= {normalise_mr(mr) for mr in synthetic_mrs(records, trained_cap, trained_seed, share, folder)}
    drawn = synthetic_mrs(records, count + len(trained), seed, attribute_share=attribute_share, folder=folder)
    return [mr for mr in drawn if normalise_mr(mr) not in trained][:count]


def example_mrs(count: int = 8, folder: Path = E2E_DATA) -> list[str]:
    """Test-set MRs for the playground's examples: one per restaurant name, the richer MRs first,
    so the examples show different places and most of the attributes."""
    picked: dict[str, str] = {}
    for record in sorted(reported_records(folder), key=lambda r: -len(parse_mr(r.mr))):
        picked.setdefault(parse_mr(record.mr)["name"], record.mr)
    return list(picked.values())[:count]
