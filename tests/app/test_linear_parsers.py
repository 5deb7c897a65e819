"""Every parser that reads a visitor's text costs time linear in it (issue 54: a line of spaces in
the MR pattern backtracked, 16.8 s for 100 k spaces, and stalled every visitor behind it).

Each parser runs on adversarial inputs of 8 k and 256 k characters. Two bounds, both generous: the
256 k input is answered in well under a second, and it costs at most 64x the 8 k input's time
(linear is 32x; the quadratic pattern was ~1000x) plus a few milliseconds of slack for a busy
machine. Each is timed in this thread's CPU time (a busy machine's preemptions are not counted),
the fastest of a few repetitions.
"""

from __future__ import annotations

import time

import pytest

from app.page.share import settings_from_query
from app.settings import Limits, PlaygroundSettings, clean_prompt
from app.task_view import compose_into_prompt, input_feedback, switch_values
from app.tasks import check_input, compose, is_valid_mr
from model.tasks.e2e import ATTRIBUTES, parse_mr

SMALL, LARGE = 8_000, 256_000
GROWTH = 64  # LARGE / SMALL is 32: linear stays under 64x, quadratic (~1000x) does not
SLACK_S = 0.005
ANSWER_S = 0.5


def adversarial(length: int) -> dict[str, str]:
    """Inputs of ``length`` characters that make a backtracking MR or prompt pattern work hardest."""
    half = length // 2
    return {
        "spaces": "a" + " " * (length - 2) + "x",
        "spaces then bracket": "name" + " " * (length - 6) + "[x",
        "open brackets": "name[" * (length // 5),
        "close brackets": "]" * length,
        "commas": "name[The Eagle]" + "," * (length - 15),
        "pairs": ("food[French], " * (length // 14))[:length],
        "key run": "a" * half + " " * half,
        "unicode": "é光 " * (length // 3),
        "tabs and newlines": "name\t[" + "\n\t " * (length // 3),
    }


PARSERS = {
    "parse_mr": lambda text: _refused(parse_mr, text),
    "is_valid_mr": is_valid_mr,
    "check_input e2e": lambda text: _refused(check_input, "e2e", text),
    "check_input tldr": lambda text: _refused(check_input, "tldr", text),
    "input_feedback": lambda text: input_feedback("e2e", text),
    "input_feedback tldr": lambda text: input_feedback("tldr", text),
    "switch_values to tldr": lambda text: switch_values("tldr", text),
    "switch_values to e2e": lambda text: switch_values("e2e", text),
    "switch_values to chat": lambda text: switch_values("chat", text),
    "compose (the form)": lambda text: compose(dict.fromkeys(ATTRIBUTES, text)),
    "compose_into_prompt": lambda text: compose_into_prompt(*[text] * len(ATTRIBUTES)),
    "clean_prompt": lambda text: _refused(clean_prompt, text, Limits()),
    "settings": lambda text: _refused(PlaygroundSettings.from_values, Limits(), prompt=text, task="e2e"),
    "share link": lambda text: settings_from_query({"prompt": text, "task": "e2e", text[:64]: text}, Limits(),
                                                   {"prompt": "Hi"}),
}


def _refused(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except ValueError as error:
        return str(error)


def fastest_seconds(function, text: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        function(text)
        best = min(best, time.thread_time() - started)
    return best


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_each_parser_of_visitor_text_is_linear_on_adversarial_input(parser):
    function = PARSERS[parser]
    small, large = adversarial(SMALL), adversarial(LARGE)
    for shape in small:
        small_s, large_s = fastest_seconds(function, small[shape]), fastest_seconds(function, large[shape])
        assert large_s < ANSWER_S, (parser, shape, large_s)
        assert large_s <= GROWTH * small_s + SLACK_S, (parser, shape, small_s, large_s)


def test_the_bounds_catch_a_quadratic_parser():
    """The test's own yardstick: the pattern issue 54 found is refused by the same bounds."""
    import re

    backtracking = re.compile(r"\s*([A-Za-z][A-Za-z ]*?)\s*\[([^\[\]]*)\]\s*(?:,|$)")
    text = adversarial(SMALL)["spaces"]
    small_s = fastest_seconds(backtracking.match, text, repeats=1)
    four_times = fastest_seconds(backtracking.match, adversarial(4 * SMALL)["spaces"], repeats=1)
    assert four_times > 8 * small_s  # quadratic: ~16x for 4x the text; the bounds above allow 2x per doubling


def test_the_linear_mr_reader_accepts_and_refuses_what_the_pattern_did():
    assert parse_mr("  name[The Eagle] ,food[French],  area [city centre], ") == {
        "name": "The Eagle", "food": "French", "area": "city centre"}
    assert parse_mr("customer rating[5 out of 5], name[X]")["customer rating"] == "5 out of 5"
    assert parse_mr("name\t[X]\n, near[Y]") == {"name": "X", "near": "Y"}
    for bad, needle in [("name[X] food[Y]", "not a list"), ("name[X], [Y]", "not a list"),
                        ("name[[X]]", "not a list"), ("name[X", "not a list"), ("na-me[X]", "not a list"),
                        ("näme[X]", "not a list"), ("colour[red], name[X]", "unknown MR attribute"),
                        ("name[X], name[Y]", "twice"), ("name[ ]", "a value of 1 to"), ("food[French]", "needs a name"),
                        ("name[X]" + " " * 5000, "characters; an MR of all eight")]:
        with pytest.raises(ValueError, match=needle):
            parse_mr(bad)


def test_a_long_paste_is_refused_by_its_length_before_it_is_read():
    with pytest.raises(ValueError, match="256000 characters"):
        parse_mr("a" + " " * (LARGE - 2) + "x")
    shown = input_feedback("e2e", "a" + " " * (LARGE - 2) + "x")
    assert shown["visible"] and "256000 characters" in shown["value"]
