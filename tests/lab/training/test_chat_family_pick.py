"""lab/training/chat_family_pick.py: the rule's pick per speedup (assets/study/gpu-chat-family/RULE.txt):
the start and every saved, scored checkpoint; the best held-out agreement at the run's own speedup,
then the lower KL, then the earlier step."""

import json


def _pick_module():
    from lab.training import chat_family_pick

    return chat_family_pick


def _work(tmp_path, records, saved, start_line):
    work = tmp_path / "work"
    for folder in ["start", *(f"skip-2x/adapter-step-{step}" for step in saved)]:
        (work / folder).mkdir(parents=True)
        (work / folder / "adapter_config.json").write_text("{}")
    (work / "logs").mkdir()
    (work / "logs" / "skip-2x.log").write_text("loading\rskip-policy training:   0%|\r" + start_line + "\nstep 50 ...\n")
    lines = [json.dumps({"step": step, "loss": 1.0, **({"heldout": scores} if scores else {})})
             for step, scores in records]
    (work / "skip-2x" / "train_log.jsonl").write_text("\n".join(lines) + "\n{\"step\": 151, \"heldo")  # a torn line
    return work


def _scores(agreement, kl):
    return {"1x": {"agreement": 1.0, "kl": 0.0}, "2x": {"agreement": agreement, "kl": kl},
            "3x": {"agreement": 0.9, "kl": 0.1}}


def test_the_pick_is_the_best_agreement_at_its_speedup_then_kl_then_the_earlier_step(tmp_path, capsys):
    pick = _pick_module()
    start = "untrained held-out: 1x agree 1.000 KL 0.000, 1.5x agree 0.700 KL 0.500, 2x agree 0.600 KL 1.100"
    records = [(49, None), (50, _scores(0.62, 1.0)), (100, _scores(0.64, 0.95)), (150, _scores(0.64, 0.90)),
               (200, _scores(0.70, 0.80))]  # step 200 scored but never saved (the run was cut): not a candidate
    work = _work(tmp_path, records, saved=(50, 100, 150), start_line=start)
    found = pick.candidates(work, 2.0)
    assert [(c.step, c.agreement, c.kl) for c in found] == [(0, 0.6, 1.1), (50, 0.62, 1.0), (100, 0.64, 0.95),
                                                           (150, 0.64, 0.9)]
    assert pick.pick(found).step == 150  # 100 and 150 agree as often: the lower KL
    tie = [pick.Candidate(100, work, 0.64, 0.9), pick.Candidate(50, work, 0.64, 0.9)]
    assert pick.pick(tie).step == 50 and pick.pick([]) is None
    assert pick.main([str(work), "2", "3"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith(f"2 {work / 'skip-2x' / 'adapter-step-150'} agreement=0.6400 kl=0.9000 step=150")
    assert second == "3 none"  # no 3x run here


def test_the_start_wins_when_training_made_it_worse(tmp_path):
    pick = _pick_module()
    start = "untrained held-out: 1x agree 1.000 KL 0.000, 2x agree 0.650 KL 1.000, 3x agree 0.400 KL 2.000"
    work = _work(tmp_path, [(50, _scores(0.60, 1.2))], saved=(50,), start_line=start)
    assert pick.pick(pick.candidates(work, 2.0)).folder == work / "start"
    assert pick.start_scores(work / "logs" / "skip-2x.log", 3.0) == (0.4, 2.0)
    assert pick.start_scores(work / "logs" / "none.log", 2.0) is None
