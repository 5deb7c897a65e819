"""Lessons and links: pure logic (the browser tests click them)."""

from app.lessons import LESSON_BASE, LESSONS, lesson_values, settings_from_query
from app.settings import Limits, PlaygroundSettings

DEFAULTS = {"warmup": 4, "order": "warmup_top"}


def test_every_lesson_is_a_valid_setting_and_says_what_to_look_for():
    assert 4 <= len(LESSONS) <= 6
    for lesson in LESSONS:
        values = lesson_values(lesson)
        assert set(values) == set(LESSON_BASE)
        PlaygroundSettings.from_values(Limits(), prompt="hi", **DEFAULTS, **values)  # raises if invalid
        assert lesson.question.endswith("?") and "Generate" in lesson.markdown()


def test_a_link_sets_known_settings_and_names_bad_or_unknown_ones():
    values, message = settings_from_query({"target_speedup": "3", "decay": "cosine", "prompt": "Hi there",
                                           "lens": "true"}, Limits(), DEFAULTS)
    assert values == {"target_speedup": 3.0, "decay": "cosine", "prompt": "Hi there", "lens": True}
    assert message == ""
    values, message = settings_from_query({"decay": "zigzag", "batch_size": "99", "evil": "1", "seed": "5"},
                                          Limits(), DEFAULTS)
    assert values == {"seed": 5}
    assert "decay" in message and "batch_size" in message and "evil" in message
