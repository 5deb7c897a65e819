"""Issue #52's page, as pure functions: facts per pane (the line, wrong and made-up first, and the
marks in the text), a known answer in chat, the speed figure of a finished short run with its
spread, and the Results tab's facts beside BLEU."""

from __future__ import annotations

import re
from dataclasses import replace

from app.page.fact_view import facts_line, known_answer_line, marked_text, pane_facts, token_marks
from app.page.results import ASSETS, e2e_note, e2e_quality_table, load_e2e
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


def test_the_skipdecode_pane_marks_the_tokens_a_fact_spans_and_keeps_their_contrast() -> None:
    pieces = ["The Golden Palace", " is", " in", " the", " city", " centre", "."]
    text = "".join(pieces)
    marks = token_marks(pieces, pane_facts(MR, {"p": text})["p"])
    assert [bool(mark) and "fact-wrong" in mark[0] for mark in marks] == [False, False, False, False, True, True, False]
    page = tokens_by_depth_html(pieces, [30, 20, 10, 9, 8, 8, 8], 30, marks)
    assert page.count("fact-wrong") == 2 and "WRONG area: the MR says riverside · 8/30 layers" in page
    assert page.count(f"color:{TOKEN_TEXT}") == len(pieces)  # the text colour of every token kept


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
    assert speed_phrase(figures, done=False) == f"measured speedup after {MIN_STEPS_FOR_MEASURED} decode steps"
    line = speed_phrase(figures, done=True)
    assert line.startswith("<b>2.00x faster</b>") and f"median of {steps} steps (too few steps to trust)" in line
    assert "Step mode" in speed_phrase(figures, done=True, step_mode=True)


def test_one_slowed_step_leaves_the_median_and_shows_in_the_range() -> None:
    full = [0.1] * 12
    full[4] = 0.9  # another process took the core for one step of the full lane
    line = speed_phrase(live_figures(_update([0.05] * 12, full)), done=True)
    assert line.startswith("<b>2.00x faster</b>") and "median of 12 steps;" in line and "cost model 2.00x" in line
    assert "Measured" not in line  # no disagreement to explain


def test_a_plain_sentence_when_measured_and_the_cost_model_part() -> None:
    slow_full = speed_phrase(live_figures(_update([0.05] * 12, [0.15] * 12)), done=True)
    assert "3.00x faster" in slow_full and "Measured beats the cost model" in slow_full
    overhead = speed_phrase(live_figures(_update([0.08] * 12, [0.1] * 12)), done=True)
    assert "1.25x faster" in overhead and "Measured falls short of the cost model" in overhead


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
