"""The runs behind the playground's landing defaults (docs/SERVING.md, "The first run"): each
candidate first run (task, prompt, speedup) through the page's own path (Playground.api_stream,
the shipped models, app.py's weights), printing what a visitor would see: the texts, whether
SkipDecode wrote the full model's very text, the full model's next-token share, the facts (E2E) or
the known answer (chat), and the measured step speedup.

    PYTHONPATH=. python lab/studies/landing_runs.py > runs.txt
"""

from __future__ import annotations

import json

from app.handlers import Playground
from app.settings import EXAMPLE_PROMPTS, Limits
from app.tasks import TaskGenerators
from model.generation.generator import TextGenerator
from model.loading import load_model
from model.tasks.e2e_facts import check_facts

# The page's default prompt, and the example and lesson questions with one known answer.
CHAT = [(prompt, speedup) for prompt in (EXAMPLE_PROMPTS[0], "What is the capital of France?",
                                         "Who wrote Romeo and Juliet?") for speedup in (2.0, 3.0)]
MRS = ("name[The Golden Palace], eatType[coffee shop], food[Italian], priceRange[cheap], area[riverside], "
       "familyFriendly[yes], near[Café Rouge]",
       "name[Giraffe], eatType[pub], food[French], area[riverside], familyFriendly[yes], near[Raja Indian Cuisine]",
       "name[The Mill], eatType[pub], food[English], priceRange[moderate], area[city centre], familyFriendly[no], "
       "near[Raja Indian Cuisine]",
       "name[Blue Spice], eatType[coffee shop], area[city centre]")
E2E = [(mr, speedup) for mr in MRS[:3] for speedup in (3.0, 5.0)]


def summary(values: dict, message: dict) -> dict:
    skip, full = message["skipdecode"][0], message["full"][0]
    row = {"task": values.get("task", "chat"), "prompt": values["prompt"], "speedup": values["target_speedup"],
           "same_text": skip == full, "next_token_share": message.get("full_model_same_next_token"),
           "step_speedup": message.get("measured_step_speedup"), "skipdecode": skip, "full": full}
    if values.get("task") == "e2e":
        row["facts"] = {pane: {f.attribute: f.state for f in check_facts(values["prompt"], text)}
                        for pane, text in (("skip", skip), ("full", full))}
    return row


def main() -> None:
    chat = TextGenerator(load_model(None, adapter="auto", quantize="auto"))
    playground = Playground(lambda: chat, Limits(), tasks=TaskGenerators())
    runs = [{"task": "e2e", "prompt": mr, "target_speedup": s, "max_new_tokens": 64} for mr, s in E2E]
    runs += [{"prompt": p, "target_speedup": s} for p, s in CHAT]
    for values in runs:
        message = list(playground.api_stream(values))[-1]
        print(json.dumps(summary(values, message), ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
