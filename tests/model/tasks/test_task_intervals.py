"""The paired bootstrap of E2E shares (model/tasks/task_intervals.py, lab/studies/e2e_share_intervals.py):
its whole-set score is the eval's own corpus BLEU, an arm identical to the task model has an interval
of exactly 1, a clearly worse arm's interval lies below 1. Fast: no model."""


import pytest

from model.tasks.task_eval import bleu, rouge_l
from model.tasks.task_intervals import per_mr_scores, pooled_bleu, share_intervals

NAMES = ["Aromi", "Zizzi", "Cotto", "Giraffe", "The Mill", "Wildwood", "Strada", "Alimentum"]
FOODS = ["French", "Italian", "Indian", "English", "Chinese"]
AREAS = ["riverside", "city centre"]
REFERENCES = [(f"{name} is a {food} restaurant in the {area} area.", f"{name} serves {food} food in the {area}.",
               f"In the {area} there is {name}, which serves {food} food.")
              for name in NAMES for food in FOODS for area in AREAS]  # 80 MRs, 3 references each
TASK_MODEL = [f"{refs[0].split(' is ')[0]} is a restaurant serving {refs[1].split(' serves ')[1].split(' food')[0]} "
              f"food in the {'riverside' if 'riverside' in refs[0] else 'city centre'} area." for refs in REFERENCES]


def words_dropped(texts: list[str], keep: float) -> list[str]:
    """Each text with its last words cut: a clearly worse arm."""
    return [" ".join(text.split()[: max(1, int(len(text.split()) * keep))]) for text in texts]


def test_the_pooled_score_of_every_mr_is_the_eval_s_own_corpus_bleu_and_rouge_l():
    arm = words_dropped(TASK_MODEL, 0.7)
    scores = per_mr_scores(arm, REFERENCES)
    assert pooled_bleu(scores.bleu_statistics) == pytest.approx(bleu(arm, REFERENCES), abs=1e-9)
    assert float(scores.rouge_l.mean()) == pytest.approx(rouge_l(arm, REFERENCES), abs=1e-9)


def test_an_arm_writing_the_task_model_s_text_has_a_share_of_exactly_one_in_every_draw():
    task_model = per_mr_scores(TASK_MODEL, REFERENCES)
    for interval in share_intervals("same", per_mr_scores(TASK_MODEL, REFERENCES), task_model, bar=0.99,
                                    resamples=200):
        assert (interval.share, interval.low, interval.high, interval.below) == (1.0, 1.0, 1.0, 0.0)


def test_a_clearly_worse_arm_lies_below_one_and_its_interval_holds_its_share():
    task_model = per_mr_scores(TASK_MODEL, REFERENCES)
    worse = per_mr_scores(words_dropped(TASK_MODEL, 0.6), REFERENCES)
    for interval in share_intervals("worse", worse, task_model, bar=0.99, resamples=300, seed=1):
        assert interval.low <= interval.share <= interval.high < 0.95
        assert interval.below == 1.0


def test_no_bar_gives_no_share_below_it_and_unequal_mr_counts_are_refused():
    task_model = per_mr_scores(TASK_MODEL, REFERENCES)
    assert all(i.below is None for i in share_intervals("arm", task_model, task_model, resamples=50))
    with pytest.raises(ValueError, match="MRs against"):
        share_intervals("short", per_mr_scores(TASK_MODEL[:40], REFERENCES[:40]), task_model, resamples=50)


def test_the_script_takes_each_arm_s_bar_from_the_speedup_its_label_names():
    from lab.studies import e2e_share_intervals as script

    assert [script.bar_for(label) for label in ("per-speedup policy 2x", "shared policy 3x", "per-speedup policy 4x",
                                                "shared policy 5x", "untouched model (1x)")] == [0.99, 0.98, None,
                                                                                                 0.95, None]
