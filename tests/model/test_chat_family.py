"""General chat's per-speedup family (model/chat_family.py): which folder is a family, which policy
runs a speedup (none in between), the model a policy was trained on, and issue #53's targets."""

import json

from model.chat_family import (
    TARGETS,
    check_targets,
    family_folder,
    family_policies,
    family_policy,
    is_family,
    policy_name,
    trained_on,
)


def _policy(folder, model=None):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "training_info.json").write_text(json.dumps({"config": {"model": model}}))
    return folder


def test_a_family_is_a_folder_of_per_speedup_policies_and_nothing_runs_in_between(tmp_path):
    family = tmp_path / "chat"
    one_half, two = _policy(family / "skip-1.5x"), _policy(family / "skip-2x", model="my/model")
    (family / "skip-3x").mkdir()  # no adapter in it: not a policy
    _policy(family / "skip-1x")  # 1x is the full model: no policy runs there
    _policy(family / "notes")
    assert family_policies(family) == {1.5: one_half, 2.0: two}
    assert is_family(family) and family_policy(family, 2.0) == two and family_policy(family, 1.5) == one_half
    assert family_policy(family, 1.75) is None and family_policy(family, 3.0) is None  # the shared policy runs
    assert not is_family(two)  # an adapter itself is not a family
    assert not is_family(tmp_path / "nowhere") and family_policies(tmp_path / "nowhere") == {}
    assert trained_on(two) == "my/model" and trained_on(one_half) is None and trained_on(tmp_path) is None
    assert policy_name(1.5) == "skip-1.5x" and policy_name(2.0) == "skip-2x"
    assert family_folder(tmp_path) == tmp_path / "chat"


def test_the_targets_are_the_issues_and_an_unmeasured_one_is_not_met():
    assert {(t.speedup, t.measure, t.bound, t.at_least) for t in TARGETS} == {
        (1.5, "fact_retention", 0.95, True), (2.0, "fact_retention", 0.90, True),
        (2.0, "judged_ppl_ratio", 1.5, False), (2.0, "agreement", 0.70, True),
        (3.0, "fact_retention", 0.75, True), (3.0, "judged_ppl_ratio", 2.5, False)}
    values = {("fact_retention", 1.5): 0.96, ("fact_retention", 2.0): 0.89, ("judged_ppl_ratio", 2.0): 1.5,
              ("agreement", 2.0): 0.71, ("judged_ppl_ratio", 3.0): 2.6}
    checks = {(c.target.speedup, c.target.measure): c for c in check_targets(values)}
    assert checks[1.5, "fact_retention"].met and not checks[2.0, "fact_retention"].met
    assert checks[2.0, "judged_ppl_ratio"].met  # at the bound: met (<=)
    assert checks[2.0, "agreement"].met and not checks[3.0, "judged_ppl_ratio"].met
    unmeasured = checks[3.0, "fact_retention"]
    assert unmeasured.value is None and not unmeasured.met
    assert unmeasured.describe() == "fact_retention >= 0.75 at 3x: not measured (not met)"
    assert checks[2.0, "judged_ppl_ratio"].describe() == "judged_ppl_ratio <= 1.5 at 2x: 1.500 (met)"
