"""Lessons and share links: pure logic (the browser tests click them)."""

from app.page.lessons import LESSON_BASE, LESSONS, LOOK_FOR_CHARS, TRAINED, lesson_by_title, lesson_names, lesson_values
from app.page.share import qr_html, settings_from_query, share_link, share_query
from app.settings import Limits, PlaygroundSettings

DEFAULTS = {"warmup": 0, "order": "ranked"}
PAGE = {"prompt": "What is photosynthesis?", **DEFAULTS}
RANGES = {"target_speedup": (1.0, 4.0), "batch_size": (1, 8)}


def test_every_lesson_and_its_second_run_are_valid_settings_that_say_what_to_look_for():
    assert len(LESSONS) == 10 and len({lesson.title for lesson in LESSONS}) == 10
    for lesson in LESSONS:
        for then in (False, True):
            values = lesson_values(lesson, DEFAULTS, then)
            assert set(values) == set(lesson_names()) and TRAINED not in values.values()
            PlaygroundSettings.from_values(Limits(), **values)  # raises if invalid
        assert lesson.question.endswith("?") and "?." not in lesson.markdown() and "Look for" in lesson.markdown()
        assert lesson.markdown().startswith(f"#### {lesson.title}\n")  # a title a class reads first
        assert len(lesson.look_for) <= LOOK_FOR_CHARS  # two lines; the rest behind "more"
        assert ("<details><summary>more</summary>" in lesson.markdown()) == bool(lesson.more)
        if lesson.then_label:
            assert lesson_values(lesson, DEFAULTS, True) != lesson_values(lesson, DEFAULTS)  # it changes something
    paper = lesson_by_title("The paper's layer order")
    assert lesson_values(paper, DEFAULTS)["order"] == "warmup_top"
    assert lesson_values(paper, DEFAULTS, then=True)["order"] == "ranked"  # back to the trained placement
    assert lesson_values(lesson_by_title("The skip policy off at 2x"), DEFAULTS)["skip_policy"] is False
    assert set(LESSON_BASE) < set(lesson_names())
    e2e = lesson_by_title("The paper's task: 3x, the same description").more
    assert e2e.index("wrong fact in") < e2e.index("BLEU") < e2e.index("ROUGE-L")  # the test set, facts first


def test_a_link_sets_known_settings_and_names_bad_out_of_range_or_unknown_ones():
    values, message = settings_from_query({"target_speedup": "3", "decay": "cosine", "prompt": "Hi there",
                                           "lens": "true"}, Limits(), DEFAULTS, RANGES)
    assert values == {"target_speedup": 3.0, "decay": "cosine", "prompt": "Hi there", "lens": True}
    assert message == ""
    values, message = settings_from_query({"decay": "zigzag", "batch_size": "99", "evil": "1", "seed": "5",
                                           "target_speedup": "9"}, Limits(), PAGE | {"target_speedup": 2.0}, RANGES)
    assert values == {"seed": 5}
    assert "decay" in message and "batch_size" in message and "evil" in message
    assert "target_speedup=9 is outside this page's range 1-4 (kept 2)" in message


def test_a_share_link_carries_only_what_differs_from_the_page_and_round_trips():
    assert share_query({}, PAGE, Limits()) == ""
    assert share_link("http://h/", {"target_speedup": 2.0, "prompt": PAGE["prompt"]}, PAGE, Limits()) == "http://h/"
    link = share_link("http://h/", {"target_speedup": 3.0, "decay": "cosine", "prompt": "Why?", "seed": 0,
                                    "skip_policy": False}, PAGE, Limits())
    assert link == "http://h/?prompt=Why%3F&target_speedup=3&decay=cosine&skip_policy=false"
    from urllib.parse import parse_qsl, urlsplit

    values, message = settings_from_query(dict(parse_qsl(urlsplit(link).query)), Limits(), PAGE, RANGES)
    assert message == "" and values == {"prompt": "Why?", "target_speedup": 3.0, "decay": "cosine",
                                        "skip_policy": False}
    qr = qr_html(link)
    assert qr.count("<svg") == 1 and "Scan" in qr


def test_a_lesson_link_names_the_lesson_by_its_number_and_may_start_it():
    from app.page.lessons import LESSONS
    from app.page.share import lesson_in_query, lesson_link

    link = lesson_link("http://h/", 3, start=True)
    assert link == "http://h/?lesson=3&run=1"
    assert lesson_in_query({"lesson": "3", "run": "1"}, len(LESSONS)) == (2, True, "")
    assert lesson_in_query({"lesson": "3"}, len(LESSONS)) == (2, False, "")
    assert lesson_in_query({}, len(LESSONS)) == (None, False, "")
    for bad in ("0", "99", "two", "-1"):
        lesson, start, problem = lesson_in_query({"lesson": bad, "run": "1"}, len(LESSONS))
        assert lesson is None and not start and f"names no lesson (1-{len(LESSONS)})" in problem
    values, message = settings_from_query({"lesson": "3", "run": "1"}, Limits(), PAGE, RANGES)
    assert values == {} and message == ""  # not unknown parameters of a settings link


def test_the_qr_code_scales_with_the_page_not_a_fixed_120_pixels():
    qr = qr_html("http://h/?lesson=3&run=1", caption="Scan to run it")
    assert "viewBox" in qr and 'width="' not in qr.split("<svg", 1)[1].split(">", 1)[0]
    assert "--qr-size: 340px" in qr and "Scan to run it" in qr
