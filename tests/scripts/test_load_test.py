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
