"""The job-cost calibration's own arithmetic (lab/serving/calibrate_job_cost.py): the fit recovers known
weights from timed jobs, and the costliest admitted jobs are at the cap. Fast: no model."""

import pytest


def calibration():
    from lab.serving import calibrate_job_cost  # it puts scripts/ on the path for load_test

    return calibrate_job_cost


def test_the_fit_recovers_the_weights_that_timed_the_jobs():
    script = calibration()
    truth = dict(unit_seconds=0.01, batch_row_weight=0.4, prompt_token_weight=0.3, lens_token_weight=1.5,
                 fixed_seconds=0.2)
    jobs = []
    for shape in script.CALIBRATION:
        prompt_tokens, steps = 40 + shape.prompt_words, shape.new_tokens * 0.9  # some end early
        seconds = script.predicted_seconds(truth, shape.batch, prompt_tokens, steps, shape.lens)
        jobs.append(dict(shape=dict(batch=shape.batch, lens=shape.lens), prompt_tokens=prompt_tokens, steps=steps,
                         seconds=seconds))
    fitted = script.fit(jobs)
    assert fitted == pytest.approx(truth, rel=1e-6, abs=1e-9)
    # The wrong weights are told apart: a batch row twice as dear is not what these jobs say.
    assert script.fit([j | {"seconds": j["seconds"] * (1 + 0.5 * (j["shape"]["batch"] > 1))} for j in jobs]) != \
        pytest.approx(truth, rel=0.05)


def test_the_worst_admitted_jobs_fill_the_cap():
    from app.serving.job_cost import job_cost

    script = calibration()
    template = script.PROMPT_TEMPLATE_TOKENS + script.COUNTING_TOKENS
    for shape in script.worst_admitted(400):
        cost = job_cost(shape.batch, shape.prompt_words + template, shape.new_tokens, shape.lens)
        assert cost <= 390  # the cap less the load test's 10 units of margin (the tokenizer's count may differ)
        if shape.prompt_words:  # and no more than one word short of it
            assert job_cost(shape.batch, shape.prompt_words + 1 + template, shape.new_tokens, shape.lens) > 390
