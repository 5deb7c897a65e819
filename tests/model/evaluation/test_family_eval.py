"""`python -m model eval --candidate FAMILY`: a chat family (one policy per speedup) beside the shared
policy on a tiny model, each family policy measured at its own speedup, paired, with issue #53's targets."""

import json

import pytest

from model.evaluation.evaluation import EvalConfig, evaluate


@pytest.mark.slow
def test_eval_compares_a_family_policy_by_policy_and_checks_the_targets(tiny_folder, tiny_chat_family, tmp_path):
    shared, root = tiny_chat_family
    family = root / "chat"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say something about item {i}."}) + "\n" for i in range(6)))
    common = dict(model=str(tiny_folder), adapter=str(shared), prompts=str(prompts), continuation_tokens=8,
                  batch_size=4, device="cpu", facts=None, include_no_adapter=False, resamples=200)
    lines: list[str] = []
    report = evaluate(EvalConfig(candidate=str(family), speedups=(1.0, 1.5, 1.75, 2.0), **common), progress=lines.append)
    assert [(r.variant, r.target_speedup) for r in report.rows] == [
        ("adapter", 1.0), ("adapter", 1.5), ("adapter", 1.75), ("adapter", 2.0), ("candidate", 1.5), ("candidate", 2.0)]
    assert set(report.family) == {"1.5x", "2x"} and report.family["2x"].endswith("skip-2x")
    assert any("no policy for 1.75x" in line for line in lines)  # in between: nothing to compare
    assert {c.target_speedup for c in report.comparisons} == {1.5, 2.0}
    assert len(report.targets) == 6 and not any(c.met for c in report.targets if c.value is None)
    agreement = next(c for c in report.targets if c.target.measure == "agreement")
    candidate_2x = next(r for r in report.rows if r.variant == "candidate" and r.target_speedup == 2.0)
    assert agreement.value == candidate_2x.agreement
    text = report.to_markdown()
    assert "Targets (issue #53, on the family's own rows)" in text and "agreement >= 0.7 at 2x" in text
    assert json.loads(json.dumps(report.to_json()))["targets"][0]["target"]["measure"] == "fact_retention"

    # each speedup ran ITS policy: the 2x row is what the 2x policy alone gives as a candidate
    alone = evaluate(EvalConfig(candidate=str(family / "skip-2x"), speedups=(2.0,), **common), progress=lambda _: None)
    single = next(r for r in alone.rows if r.variant == "candidate")
    assert (single.agreement, single.perplexity_ratio, single.bleu) == \
        (candidate_2x.agreement, candidate_2x.perplexity_ratio, candidate_2x.bleu)
    assert not alone.family and not alone.targets and "Targets" not in alone.to_markdown()
    with pytest.raises(ValueError, match="a trained adapter folder or a family folder"):
        evaluate(EvalConfig(candidate="none", speedups=(2.0,), **common), progress=lambda _: None)
