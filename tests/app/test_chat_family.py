"""General chat with a per-speedup family installed (app/chat_family.py): SkipDecode at a family
speedup runs that speedup's own policy, in between (and at 1x, or with the policy off) the shared one,
and the status line says which ran; on a tiny model with a tiny family trained in a temp folder."""

import pytest

from app.settings import Limits


@pytest.mark.slow
def test_the_playground_runs_the_family_policy_of_the_speedup_and_says_which(tiny_folder, tiny_chat_family):
    from app.chat_family import ChatPolicies
    from app.handlers import Playground
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    shared, root = tiny_chat_family
    general = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=str(shared)))
    chat = ChatPolicies(root=root)  # the real loader: the policy on the general model's weights and device
    two = chat.generator(2.0, general)
    assert two is not general and two.loaded.adapter_path == str(root / "chat" / "skip-2x")
    assert chat.generator(2.0, general) is two  # cached
    assert chat.generator(1.75, general) is general and chat.generator(1.0, general) is general  # shared in between
    assert chat.generator(3.0, general) is general  # no 3x policy in this family
    bare = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    assert chat.generator(2.0, bare) is bare and chat.line(2.0, True, bare, bare) == ""  # no skip policy: no family
    assert ChatPolicies(root=root / "nowhere").line(2.0, True, general, general) == ""  # no family installed

    playground = Playground(lambda: general, Limits(), chat=chat)
    values = {"prompt": "Hi", "max_new_tokens": 3, "warmup": 1, "order": "warmup_top"}
    assert playground.admission_problem("ui_generate", values | {"target_speedup": 1.5}) is None  # sized, not loaded
    outputs = list(playground.generate(values | {"target_speedup": 2.0}))
    assert outputs[0][0].startswith("General chat: SkipDecode runs at 2x with skip-2x, the skip policy trained "
                                    "for this speedup only")
    assert "Done" in outputs[-1][0]
    between = list(playground.generate(values | {"target_speedup": 1.75}))
    assert between[0][0].startswith("General chat: SkipDecode runs at 1.75x with the shared skip policy (the "
                                    "per-speedup policies are trained for 1.5x, 2x)")
    assert playground.generator_for(playground.settings(values | {"target_speedup": 2.0})) is two  # what ran
    off = list(playground.generate(values | {"target_speedup": 2.0, "skip_policy": False}))
    assert not off[0][0].startswith("General chat:")  # the policy switched off: no family either
    assert playground.generator_for(playground.settings(values | {"target_speedup": 2.0, "skip_policy": False})) \
        is general
    figure, note = playground.schedule_preview(values | {"target_speedup": 2.0})  # the loaded 2x policy's shape
    assert note == "" and figure is not None
    message = list(playground.api_stream(values | {"target_speedup": 2.0}))[-1]  # the API runs the same policy
    reference = two.generate(playground.settings(values | {"target_speedup": 2.0})
                             .request(full=False, num_layers=two.num_layers))
    assert message["skipdecode"][0] == reference.outputs[0]
