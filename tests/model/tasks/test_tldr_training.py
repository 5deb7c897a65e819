"""The TL;DR skip policies (model/tasks/tldr_training.py): which written posts are distilled from, targets
made once from a recorded source, and a policy trained under the task's one schedule, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.tasks.tldr import DECAY_LENGTH, FLOOR_SHARE, TldrPost
from model.tasks.tldr_pick import Candidate
from model.tasks.tldr_training import (
    DISTIL_POSTS,
    MAX_POST_REPETITION,
    TldrRun,
    distillation_posts,
    title_coverage,
    train_config,
    usable_post,
)

STORY = ("Last week my boyfriend forgot my birthday again. We had planned dinner at the Italian place near the "
         "station, and he said he was stuck at work, but his friend posted photos of them at a bar that night. ")


def written_posts(folder: Path) -> Path:
    """Four distillation posts (the tiny model writes a non-empty TL;DR for some of them)."""
    path = folder / "posts.jsonl"
    rows = [{"post_id": f"synthetic-{i}", "subreddit": "relationships", "title": f"My boyfriend forgot my birthday {i}",
             "post": STORY + f"It was the {i}th time, and I told him I was hurt."} for i in range(4)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_grown_posts_file_summarises_only_its_new_posts(tmp_path, monkeypatch):
    import model.tasks.tldr_training as tldr_training

    summarised: list[str] = []

    def fake_summaries(generator, posts, max_new_tokens, batch_size=8):
        summarised.extend(p.post_id for p in posts)
        return [{"post_id": p.post_id, "prompt": tldr_training.task_prompt(p), "completion": f"about {p.post_id}"}
                for p in posts]

    monkeypatch.setattr(tldr_training, "task_model_summaries", fake_summaries)
    monkeypatch.setattr(tldr_training, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(tldr_training, "TextGenerator", lambda loaded: None)
    posts = written_posts(tmp_path)
    targets = tmp_path / "targets.jsonl"
    tldr_training.write_targets(targets, posts)
    assert summarised == [f"synthetic-{i}" for i in range(4)]
    rows = posts.read_text().splitlines()
    grown = [json.loads(rows[0]) | {"post_id": "varied-0", "title": "My boyfriend forgot my birthday again"}]
    posts.write_text("\n".join(rows) + "\n" + "".join(json.dumps(row) + "\n" for row in grown))
    tldr_training.write_targets(targets, posts)
    assert summarised[4:] == ["varied-0"]  # the four made before are kept
    made = [json.loads(line)["post_id"] for line in targets.read_text().splitlines()]
    assert made == [f"synthetic-{i}" for i in range(4)] + ["varied-0"]
    source = targets.with_suffix(".source.json")
    source.write_text(source.read_text().replace('"max_new_tokens": 48', '"max_new_tokens": 32'))
    tldr_training.write_targets(targets, posts)  # made with another length: every post again
    assert summarised[5:] == made


def post(text: str, title: str = "My [24 F] boyfriend [26 M] forgot my birthday, what should I do?") -> TldrPost:
    return TldrPost("synthetic-9", "relationships", title, text, "")


def test_a_post_about_its_title_is_kept_and_a_looping_or_wandering_one_is_not():
    assert usable_post(post(STORY + "I asked him about it and he got angry, so now I do not know what to say."))
    looping = post("I am a superhero and I save your life. " * 10)
    assert not usable_post(looping)
    wandering = post("The Great Conceacher landed on a planet called Premise, where every step was a twist "
                     "and turn of fate, and the journey was full of wonder and secrets for the crew.")
    assert title_coverage(wandering) < 0.3 and not usable_post(wandering)


def test_the_committed_posts_keep_most_of_them_and_none_is_a_test_post():
    written = sum(1 for line in DISTIL_POSTS.read_text().splitlines() if line.strip())
    kept = distillation_posts(DISTIL_POSTS)  # raises where a title or post is a test post's
    assert 0.5 * written < len(kept) < written  # the filter drops some and keeps most
    assert all(usable_post(p) and p.post_id.startswith(("synthetic-", "varied-")) for p in kept)
    assert MAX_POST_REPETITION < 0.2


def test_a_policy_trains_under_the_tasks_one_schedule_with_the_prompt_kept_whole(tmp_path):
    config = train_config(TldrRun(speedup=3.0, output_dir=str(tmp_path)), tmp_path / "targets.jsonl")
    assert (config.fixed_speedup, config.fixed_decay, config.fixed_decay_length) == (3.0, "linear", DECAY_LENGTH)
    assert config.floor_share == FLOOR_SHARE and config.gate_lora and config.task_adapter is None
    assert config.max_length >= 600  # the longest prompt (~420 tokens with the template) and its TL;DR
    with pytest.raises(ValueError, match="--speedup"):
        TldrRun(speedup=1.0)
    with pytest.raises(ValueError, match="--then"):
        TldrRun(then=(2.0,), export="assets/adapters/tldr/skip-3x")
    # a second round: from the shipped policy, with the KL to the task model beside the cross-entropy
    second = train_config(TldrRun(speedup=3.0, output_dir=str(tmp_path), kl_weight=0.5, from_shipped=True),
                          tmp_path / "targets.jsonl")
    assert second.kl_weight == 0.5 and second.init_adapter.endswith("tldr/skip-3x") and second.flip_weight == 0
    # the tokens the policy's greedy choice gets wrong weigh more (the cross-entropy's flip weight)
    flipped = train_config(TldrRun(speedup=3.0, output_dir=str(tmp_path), flip_weight=2.0), tmp_path / "targets.jsonl")
    assert flipped.flip_weight == 2.0 and flipped.kl_weight == 0
    with pytest.raises(ValueError, match="--flip-weight"):
        TldrRun(flip_weight=-1.0)
    with pytest.raises(ValueError, match="no shipped TL;DR policy for 1.5x"):
        train_config(TldrRun(speedup=1.5, from_shipped=True), tmp_path / "targets.jsonl")


@pytest.mark.slow
def test_targets_are_made_once_and_a_stopped_run_resumes_to_an_exported_policy(tiny_folder, tmp_path):
    from model.tasks.tldr_training import train_tldr_policy

    posts = written_posts(tmp_path)
    common = dict(model=str(tiny_folder), speedup=2.0, warmup=1, batch_size=2, save_every=1, posts_file=str(posts),
                  summaries_file=str(tmp_path / "targets.jsonl"), output_dir=str(tmp_path / "run"), device="cpu")
    train_tldr_policy(TldrRun(**common, steps=1))
    targets = [json.loads(line) for line in (tmp_path / "targets.jsonl").read_text().splitlines()]
    assert targets and all(t["prompt"].endswith("TL;DR of the post above in one sentence:") for t in targets)
    made = (tmp_path / "targets.jsonl").stat().st_mtime_ns
    [result] = train_tldr_policy(TldrRun(**common, steps=2, resume=True, export=str(tmp_path / "skip-2x")))
    assert result.steps == 2 and (tmp_path / "targets.jsonl").stat().st_mtime_ns == made  # reused, not made again
    info = json.loads((tmp_path / "skip-2x" / "training_info.json").read_text())
    assert info["step"] == 2 and info["config"]["fixed_speedup"] == 2.0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exported"] == str(tmp_path / "skip-2x")
    assert sorted(p.name for p in (tmp_path / "run").glob("adapter-step-*")) == ["adapter-step-000001",
                                                                                 "adapter-step-000002"]

    # the held-out pick scores every kept step and the policy-free model, and records the rule's choice
    from model.tasks.tldr_eval import TldrEvalConfig
    from model.tasks.tldr_pick import choose, pick_policy

    config = TldrEvalConfig(speedups=(2.0,), prompt_depth_speedups=(), max_new_tokens=6, decay_length=4,
                            batch_size=3, warmup=1)
    entry = pick_policy(tmp_path / "run", 2.0, posts=3, model=str(tiny_folder), device="cpu",
                        export_root=tmp_path / "shipped", picks_file=tmp_path / "picks.json", config=config,
                        every=1)
    names = [c["name"] for c in entry["candidates"]]
    assert names == ["general", "adapter-step-000001", "adapter-step-000002"] and entry["heldout_posts"] == 3
    assert entry["chosen"] == choose([Candidate(**c) for c in entry["candidates"]]).name
    assert (entry["exported"] is None) == (entry["chosen"] == "general")
    assert json.loads((tmp_path / "picks.json").read_text())["2x"] == entry

    # a second round: the shipped policy is a candidate, and the first round's record is kept beside the new one
    from model.skipdecode.skip_policy import export_adapter

    export_adapter(tmp_path / "run" / "adapter-step-000001", tmp_path / "shipped" / "tldr" / "skip-2x")
    second = pick_policy(tmp_path / "run", 2.0, posts=3, model=str(tiny_folder), device="cpu",
                         export_root=tmp_path / "shipped", picks_file=tmp_path / "picks.json", config=config, every=1)
    assert [c["name"] for c in second["candidates"]] == ["general", "shipped", "adapter-step-000001",
                                                         "adapter-step-000002"]
    assert second["chosen"] == choose([Candidate(**c) for c in second["candidates"]], second["full_subject"]).name
    assert second["earlier_rounds"][0]["candidates"] == entry["candidates"]
    shipped_now = (tmp_path / "shipped" / "tldr" / "skip-2x" / "adapter_config.json").is_file()
    assert shipped_now == (second["chosen"] != "general")


@pytest.mark.slow
def test_later_speedups_share_the_first_runs_prefilled_prompts(tiny_folder, tmp_path, monkeypatch):
    import model.tasks.tldr_training as tldr_training
    from model.training.prompt_store import PromptStore

    stores = []

    class Recorded(PromptStore):
        def __init__(self):
            super().__init__()
            stores.append(self)

    monkeypatch.setattr(tldr_training, "PromptStore", Recorded)
    monkeypatch.chdir(tmp_path)  # the runs go to runs/tldr-skip-<S>x
    posts = written_posts(tmp_path)
    tldr_training.train_tldr_policy(TldrRun(model=str(tiny_folder), speedup=1.5, then=(2.0,), warmup=1, steps=2,
                                            batch_size=2, save_every=2, posts_file=str(posts), device="cpu",
                                            summaries_file=str(tmp_path / "summaries.jsonl")))
    targets = len((tmp_path / "summaries.jsonl").read_text().splitlines())
    assert [path.name for path in sorted((tmp_path / "runs").iterdir())] == ["tldr-skip-1.5x", "tldr-skip-2x"]
    assert all((tmp_path / "runs" / name / "adapter" / "adapter_config.json").is_file()
               for name in ("tldr-skip-1.5x", "tldr-skip-2x"))
    assert len(stores) == 1 and stores[0].prefilled == targets  # the 2x run prefilled nothing again


def test_the_rule_ships_a_checkpoint_only_where_it_beats_the_general_policy_by_the_margin():
    from model.tasks.tldr_pick import MIN_GAIN, choose

    general = Candidate("general", None, 10.0, 0.950)
    close = Candidate("adapter-step-000050", 50, 10.1, 0.950 + MIN_GAIN / 2)
    assert choose([general, close]) == general
    better = Candidate("adapter-step-000100", 100, 10.5, 0.970)
    tie = Candidate("adapter-step-000150", 150, 10.5, 0.970)
    assert choose([general, close, tie, better]) == better  # the earlier of two equal steps
    assert choose([general]) == general


def test_the_rule_keeps_to_candidates_that_name_the_main_subject_and_the_shipped_one_wins_a_tie():
    from model.tasks.tldr_pick import SUBJECT_POINTS, choose

    general = Candidate("general", None, 10.0, 0.90, 10.0)
    shipped = Candidate("shipped", None, 12.0, 1.00, 18.0)  # best share, but the subject 7 points under 1x's 25
    named = Candidate("adapter-step-000100", 100, 11.5, 0.97, 25.0 - SUBJECT_POINTS)
    later = Candidate("adapter-step-000200", 200, 11.0, 0.96, 24.0)
    assert choose([general, shipped, named, later], full_subject=25.0) == named
    assert choose([general, shipped, named, later]) == shipped  # rates not scored: the share alone
    # none eligible: all are, by share
    assert choose([general, shipped, Candidate("adapter-step-000100", 100, 11.0, 0.95, 10.0)], full_subject=25.0) == shipped
    tie = Candidate("adapter-step-000100", 100, 12.0, 1.00, 18.0)
    assert choose([general, tie, shipped], full_subject=18.0) == shipped  # no churn on a tie
    worse = Candidate("shipped", None, 9.0, 0.80, 25.0)
    assert choose([general, worse], full_subject=25.0) == general  # a policy must beat the general one
