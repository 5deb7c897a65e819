"""The hostile load test's own measuring logic (scripts/load_test.py): what counts as a surviving
tag, and the prompts it sizes to the job cost cap. Fast: no server."""


from tests.support import script_module


def load_test():
    return script_module("load_test")


def test_escaped_markup_is_text_and_real_markup_is_counted():
    script = load_test()
    escaped = script.rendered_elements(script.rendered_markdown(
        "**The link has a problem:** &#60;form&#62;&#60;input&#62;&#60;a href&#61;&#34;x&#34;&#62;"))
    assert escaped == {"tags": ["p", "strong"], "form": 0, "input": 0, "a": 0, "href": 0, "style": 0}
    raw = script.rendered_elements(script.rendered_markdown(
        '<form><input type="password"></form>\n\n[t](http://evil.example) <b style="position:fixed">x</b>'))
    assert raw["form"] == 1 and raw["input"] == 1 and raw["a"] == 1 and raw["href"] == 1 and raw["style"] == 1
    assert script.markup_counts("<FORM><Input HREF=") == {"<form": 1, "<input": 1, "href=": 1}


def test_the_costliest_admitted_prompt_fits_the_cap_and_one_more_word_does_not():
    script = load_test()
    for batch, new_tokens, lens in ((1, 256, False), (8, 48, False), (1, 160, True)):
        words = script.words_for_cost(batch, new_tokens, lens, 390, template=51)
        assert words > 0
        assert script.job_cost_units(batch, words + 51, new_tokens, lens) <= 390
        assert script.job_cost_units(batch, words + 52, new_tokens, lens) > 390
    assert script.words_for_cost(8, 256, True, 400) == 0  # even an empty prompt is over
    assert script.job_cost_units(8, 768, 256, True) == 2481  # the 67-98 s job


def _hostile_report(**changes) -> dict:
    """A hostile report whose every probe ran and met its target, with ``changes`` applied."""
    report = {
        "cancel_storm": {"server_cpu_s_in_window_2_to_7_s_after_last_cancel": 0.1, "cancelled_while_processing": 5},
        "long_sessions": {"sessions": 3, "finished_ok": 3},
        "memory": {"idle_vs_before_percent": 1.0}, "rest_refusals": {}, "errors_without_message": {"count": 0},
        "queue_flood": {"while_another_job_runs": True, "second_client": {"ok": True}},
        "rest_flood_and_victim": {"victim_within_bound": True, "under_flood": {"first_message_s": 0.5}, "bound_s": 2.0},
    }
    for key, value in changes.items():
        report[key] = {**report[key], **value}
    return report


def test_a_probe_the_server_refused_is_a_missed_target_not_a_pass():
    """A long prompt over the job-cost cap is refused at once: the probe it was for then measures nothing."""
    script = load_test()
    assert script.missed_targets(_hostile_report()) == []
    missed = script.missed_targets(_hostile_report(cancel_storm={"cancelled_while_processing": 0},
                                                   long_sessions={"finished_ok": 0},
                                                   queue_flood={"while_another_job_runs": False}))
    assert len(missed) == 3 and "cancelled no job" in missed[0] and "3 of 3 long sessions" in missed[1]
    assert "runner was not running" in missed[2]
