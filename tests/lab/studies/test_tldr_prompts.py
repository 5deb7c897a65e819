"""The TL;DR prompt choice (lab/studies/tldr_prompts.py): its rule, and every prompt it weighs makes a prompt
from any post. Fast: no model."""

from model.tasks.tldr import PROMPT, PROMPTS, TldrPost, task_prompt


def test_the_rule_takes_the_best_rouge_and_within_half_a_point_the_one_naming_the_subject_more():
    from lab.studies.tldr_prompts import chosen

    scores = {"a": {"rouge_l": 20.0, "names_main_subject": 0.30}, "b": {"rouge_l": 19.6, "names_main_subject": 0.40},
              "c": {"rouge_l": 18.0, "names_main_subject": 0.90}}
    assert chosen(scores) == "b"  # within 0.5 of the best, and names the subject more often
    assert chosen({**scores, "b": {"rouge_l": 19.4, "names_main_subject": 0.40}}) == "a"


def test_every_prompt_holds_the_post_and_its_title():
    post = TldrPost("t3_x", "tifu", "TIFU by {braces}", "I dropped my phone {again}.", "Phone dropped.")
    assert PROMPT in PROMPTS
    for template in PROMPTS.values():
        text = task_prompt(post, template)
        assert post.post in text and post.title in text  # braces in a post are text, not a format field
