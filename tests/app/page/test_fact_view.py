"""Issue #52's page, as pure functions: facts per pane (the line, wrong and made-up first, and the
marks in the text), a known answer in chat, the speed figure of a finished short run with its
spread, and the Results tab's facts beside BLEU."""

from __future__ import annotations

import re
from dataclasses import replace
from html.parser import HTMLParser

from app.page.fact_view import (
    FACT_LEGEND,
    facts_line,
    known_answer_line,
    marked_text,
    pane_facts,
    repeated_sentence,
    token_marks,
    whole_word_span,
)
from app.page.results import ASSETS, e2e_note, e2e_quality_table, load_e2e
from app.page.style import CSS
from app.page.token_html import TOKEN_TEXT, marked_text_html, tokens_by_depth_html
from app.page.views import MIN_STEPS_FOR_MEASURED, live_figures, speed_phrase
from model.race import RaceUpdate, StreamProgress
from model.skipdecode.decoder import DecodeResult
from model.skipdecode.schedule import CostModel, ScheduleConfig, evaluate_schedule

# The 5x run: "It is located in the city centre" for area[riverside].
MR = ("name[The Golden Palace], eatType[coffee shop], food[Italian], priceRange[cheap], area[riverside], "
      "familyFriendly[yes], near[Café Rouge]")
WRONG = ("The Golden Palace is a cheap Italian coffee shop near Café Rouge. It is located in the city centre and "
         "has a 5 out of 5 rating.")
RIGHT = "The Golden Palace is a cheap, family friendly Italian coffee shop by the riverside near Café Rouge."


def test_the_line_leads_each_pane_with_its_wrong_and_made_up_facts() -> None:
    line = facts_line(pane_facts(MR, {"SkipDecode": WRONG, "full model": RIGHT}))
    skip, full = line.split(" · ")
    assert skip.index("WRONG") < skip.index("made up") < skip.index("stated") < skip.index("missing")
    assert '<b>1 WRONG</b> (area: "city centre", the MR says riverside)' in skip
    assert "5 of 7 stated" in skip and "missing: familyFriendly" in skip
    assert full == "full model: 7 of 7 stated, none wrong or made up."
    assert facts_line(None) == "" and pane_facts("no MR here", {"SkipDecode": WRONG}) is None


def test_the_full_pane_marks_the_span_of_each_fact_with_a_hover_line() -> None:
    page = marked_text_html(marked_text(WRONG, pane_facts(MR, {"p": WRONG})["p"]))
    assert '<span class="fact fact-wrong" title="WRONG area: the MR says riverside">city centre</span>' in page
    assert '<span class="fact fact-made-up" title="made up: the MR gives no customer rating">5 out of 5</span>' in page
    assert '<span class="fact fact-stated" title="near stated (Café Rouge)">Café Rouge</span>' in page
    assert re.sub(r"<[^>]+>", "", page) == WRONG  # the text itself whole, nothing added or lost


class _MarkedWords(HTMLParser):
    """The text inside each element of one class, nested elements' text included: what one mark frames."""

    def __init__(self, cls: str) -> None:
        super().__init__()
        self.cls, self.open, self.found = cls, [], []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        marked = self.cls in (dict(attrs).get("class") or "").split()
        self.open.append(marked)
        if marked:
            self.found.append("")

    def handle_endtag(self, tag: str) -> None:
        self.open.pop()

    def handle_data(self, data: str) -> None:
        if any(self.open):
            self.found[-1] += data


def marked_words(page: str, cls: str) -> list[str]:
    parser = _MarkedWords(cls)
    parser.feed(page)
    return parser.found


def test_the_skipdecode_pane_marks_the_tokens_a_fact_spans_and_keeps_their_contrast() -> None:
    pieces = ["The Golden Palace", " is", " in", " the", " city", " centre", "."]
    text = "".join(pieces)
    marks = token_marks(pieces, pane_facts(MR, {"p": text})["p"])
    assert [bool(mark) and "fact-wrong" in mark[0] for mark in marks] == [False, False, False, False, True, True, False]
    page = tokens_by_depth_html(pieces, [30, 20, 10, 9, 8, 8, 8], 30, marks)
    assert marked_words(page, "fact-wrong") == ["city centre"]  # one box over both words, the space before outside
    assert "WRONG area: the MR says riverside · 8/30 layers" in page  # each token's hover still names the fact
    assert page.count(f"color:{TOKEN_TEXT}") == page.count('class="tok"')  # the text colour of every token kept
    assert re.sub(r"<[^>]+>", "", page) == text


def test_a_wrong_word_split_over_two_tokens_is_one_box() -> None:
    mr = "name[The Eagle], eatType[pub], area[city centre]"
    pieces = ["The Eagle", " is", " a", " pub", " by", " the", " rivers", "ide", "."]
    marks = token_marks(pieces, pane_facts(mr, {"p": "".join(pieces)})["p"])
    assert marks[6] == marks[7] and marks[6] is not None and "fact-wrong" in marks[6][0]
    page = tokens_by_depth_html(pieces, [30, 20, 10, 9, 8, 8, 7, 6, 6], 30, marks)
    assert page.count("fact-wrong") == 1 and marked_words(page, "fact-wrong") == ["riverside"]
    assert marked_words(page, "fact-stated") == ["The Eagle", "pub"]
    assert page.count('class="tok"') == len(pieces) + 2  # " pub", " rivers": each its space, then its word in the mark


def test_a_wrong_number_is_boxed_as_its_whole_phrase_with_room_around_it() -> None:
    mr = "name[The Eagle], customer rating[5 out of 5]"
    pieces = ["The Eagle", " has", " a", " 3", " out", " of", " 5", " rating", "."]
    marks = token_marks(pieces, pane_facts(mr, {"p": "".join(pieces)})["p"])
    page = tokens_by_depth_html(pieces, [30] * len(pieces), 30, marks)
    assert marked_words(page, "fact-wrong") == ["3 out of 5"]
    fact_rule = re.search(r"\.fact \{([^}]*)\}", CSS)
    assert fact_rule and "padding" in fact_rule.group(1)  # a lone "3" gets room inside its box
    full = marked_text_html(marked_text("It has a 3 out of 5 rating.", pane_facts(mr, {"p": "It has a 3 out of 5 rating."})["p"]))
    assert marked_words(full, "fact-wrong") == ["3 out of 5"]


def test_a_mark_covers_whole_words_never_part_of_one() -> None:
    assert whole_word_span("a very cheaply priced pub", (7, 12)) == (7, 14)  # "cheap" of "cheaply": the word
    assert whole_word_span("in the city centre.", (6, 18)) == (7, 18)  # a space at an end stays out
    assert whole_word_span("£20-25 a head", (0, 6)) == (0, 6)


def test_the_legend_explains_each_mark_in_words_and_draws_it_as_the_panes_do() -> None:
    for cls, words in (("fact-stated", "blue underline"), ("fact-wrong", "red box"), ("fact-made-up", "dashed brown")):
        assert f'<span class="fact {cls}">{words}</span>' in FACT_LEGEND
        assert f".{cls}" in CSS
    assert FACT_LEGEND.index("WRONG") < FACT_LEGEND.index("made-up fact") < FACT_LEGEND.index("stated")  # worst first


def test_a_sentence_said_twice_is_found_and_short_or_different_ones_are_not() -> None:
    looped = "The Eagle is a pub. It is not kid friendly. It is not  kid friendly."
    assert repeated_sentence(looped) == "It is not kid friendly."
    assert repeated_sentence("It is cheap. it is CHEAP!") == "it is CHEAP!"
    assert repeated_sentence("Yes. Yes. It is a pub.") is None  # under three words: not the loop
    assert repeated_sentence(RIGHT) is None and repeated_sentence("") is None


def test_a_known_answer_is_checked_in_each_pane() -> None:
    line = known_answer_line("What is the capital of France?", {"SkipDecode": "It is Lyon.", "full model": "Paris."})
    assert line == " Known answer (Paris): SkipDecode <b>does not</b> · full model <b>states it</b>."
    assert known_answer_line("What is photosynthesis?", {"SkipDecode": "x"}) == ""


def _progress(step_seconds: list[float], depth: int) -> StreamProgress:
    record = DecodeResult(num_layers=30, prompt_lengths=[3], tokens=[[1, *(2 + k for k in range(len(step_seconds)))]],
                          finish_reasons=["length"], prefill_layers=tuple(range(30)),
                          step_layers=[tuple(range(30 - depth, 30))] * len(step_seconds),
                          prefill_seconds=0.1, step_seconds=list(step_seconds))
    return StreamProgress("s", rows=1, record=record)


def _update(skip_seconds: list[float], full_seconds: list[float]) -> RaceUpdate:
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    return RaceUpdate(_progress(skip_seconds, 15), _progress(full_seconds, 30), solved, "skip", cost)


def test_a_finished_short_run_gets_a_figure_with_its_step_count() -> None:
    steps = MIN_STEPS_FOR_MEASURED - 1  # an 8-token answer: 7 decode steps after the prefill's token
    figures = live_figures(_update([0.05] * steps, [0.1] * steps))
    assert speed_phrase(figures, 2.0, done=False) == (f"Target 2x fewer layers; the cost model expects 2.00x here; "
                                                      f"measured speedup after {MIN_STEPS_FOR_MEASURED} decode steps")
    line = speed_phrase(figures, 2.0, done=True)
    assert "measured <b>2.00x faster</b> per decode step" in line
    assert f"(the median of {steps} steps, too few to trust;" in line
    assert "Step mode" in speed_phrase(figures, 2.0, done=True, step_mode=True)


def test_one_slowed_step_leaves_the_median_and_shows_in_the_range() -> None:
    full = [0.1] * 12
    full[4] = 0.9  # another process took the core for one step of the full lane
    line = speed_phrase(live_figures(_update([0.05] * 12, full)), 2.0, done=True)
    assert line == ("Target 2x fewer layers; the cost model expects 2.00x here; measured <b>2.00x faster</b> per "
                    "decode step (the median of 12 steps; middle half 2.00x–2.00x)")  # no disagreement to explain


def test_a_plain_sentence_when_measured_and_the_cost_model_part() -> None:
    slow_full = speed_phrase(live_figures(_update([0.05] * 12, [0.15] * 12)), 2.0, done=True)
    assert "3.00x faster" in slow_full and "Measured beats the cost model" in slow_full
    overhead = speed_phrase(live_figures(_update([0.08] * 12, [0.1] * 12)), 2.0, done=True)
    assert "1.25x faster" in overhead and "Measured falls short of the cost model" in overhead


def test_a_speedup_near_or_under_one_says_no_faster_or_slower_never_faster() -> None:
    near = speed_phrase(live_figures(_update([0.101] * 12, [0.1] * 12)), 2.0, done=True)  # 0.99x: the run
    assert "measured <b>no faster</b> per decode step (0.99x, the median of 12 steps;" in near
    assert "faster</b>" not in near.replace("no faster</b>", "")
    slightly = speed_phrase(live_figures(_update([0.1] * 12, [0.104] * 12)), 2.0, done=True)  # 1.04x: within noise
    assert "<b>no faster</b>" in slightly and "(1.04x," in slightly
    slower = speed_phrase(live_figures(_update([0.125] * 12, [0.1] * 12)), 2.0, done=True)
    assert "measured <b>slower</b> per decode step (0.80x," in slower and "x faster" not in slower
    assert "Measured falls short of the cost model" in slower
    faster = speed_phrase(live_figures(_update([0.095] * 12, [0.1] * 12)), 2.0, done=True)
    assert "measured <b>1.05x faster</b>" in faster


def test_the_target_the_cost_model_and_the_measured_figure_are_one_sentence() -> None:
    cost = CostModel(layer_cost=1.0, fixed_cost=60.0)  # a head that never skips: the cost model expects 1.2x of 2x
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    update = RaceUpdate(_progress([0.075] * 12, 15), _progress([0.1] * 12, 30), solved, "skip", cost)
    line = speed_phrase(live_figures(update), 2.0, done=True)
    assert line == ("Target 2x fewer layers; the cost model expects 1.20x here; measured <b>1.33x faster</b> per "
                    "decode step (the median of 12 steps; middle half 1.33x–1.33x)")  # within a fifth: no more said
    assert speed_phrase(live_figures(update), 1.0, done=True).startswith("Target 1x: every layer runs;")


def test_the_results_table_and_the_note_put_facts_before_bleu() -> None:
    report = load_e2e(ASSETS / "eval" / "e2e-delexicalised.json")
    header = e2e_quality_table(report).splitlines()[0]
    assert header.index("a wrong fact") < header.index("a made-up fact") < header.index("BLEU")
    note = e2e_note(5.0, True)
    assert note.index("wrong fact in") < note.index("BLEU") and "every fact right in" in note
    assert "a wrong fact" not in e2e_quality_table(replace_facts(report))  # no facts file: the old table


def replace_facts(report: dict) -> dict:
    return {**report, "facts": {}}


def test_a_run_of_the_unchanged_layout_keeps_its_figures() -> None:
    figures = live_figures(_update([0.05] * 12, [0.1] * 12))
    assert figures.steady is not None and figures.steady.steps == 12
    assert replace(figures, steady=None).measured_speedup == figures.measured_speedup
