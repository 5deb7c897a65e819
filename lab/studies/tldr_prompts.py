"""Which prompt makes the TL;DR task model: each of model/tasks/tldr.py's PROMPTS at 1x (the default model,
greedy, the CPU default weights) on the held-out slice, scored by ROUGE-L against the references.

The rule, fixed before the run: the prompt with the highest mean ROUGE-L on the held-out posts; within 0.5
points of it, the one whose summaries name the main subject more often. The reported posts are never read.

    PYTHONPATH=. python lab/studies/tldr_prompts.py --posts 100 --json assets/study/tldr-prompts.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from model.common.hardware import cpu_flags, cpu_model
from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import load_model
from model.tasks.tldr import PROMPTS, main_subject, mean, names_main_subject, read_posts, rouge_scores, split_posts
from model.tasks.tldr_eval import summarise


def score_prompt(generator: TextGenerator, posts: list, template: str, batch_size: int, max_new_tokens: int) -> dict:
    outputs, _, _ = summarise(generator, posts, ScheduleRequest(full=True), max_new_tokens, batch_size, template)
    rouge = [rouge_scores(text, post.reference)["rougeL"] for text, post in zip(outputs, posts)]
    subjects = [(text, main_subject(post)) for text, post in zip(outputs, posts)]
    named = [names_main_subject(text, subject) for text, subject in subjects if subject.known]
    return {"rouge_l": round(100 * mean(rouge), 2), "names_main_subject": round(mean(named), 3),
            "empty": sum(not text for text in outputs), "examples": outputs[:3]}


def chosen(scores: dict[str, dict]) -> str:
    best = max(row["rouge_l"] for row in scores.values())
    close = [name for name, row in scores.items() if row["rouge_l"] >= best - 0.5]
    return max(close, key=lambda name: scores[name]["names_main_subject"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--posts", type=int, default=100, help="held-out posts (at most the slice's 100)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    heldout, _ = split_posts(read_posts())
    posts = heldout[: args.posts]
    generator = TextGenerator(load_model(None, adapter="auto", quantize="auto"))  # the CPU default weights
    start = time.perf_counter()
    scores = {name: score_prompt(generator, posts, template, args.batch_size, args.max_new_tokens)
              for name, template in PROMPTS.items()}
    report = {"command": "PYTHONPATH=. python lab/studies/tldr_prompts.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
              "heldout_posts": len(posts), "weights": generator.loaded.weights, "cpu": cpu_model(),
              "cpu_flags": cpu_flags(), "minutes": round((time.perf_counter() - start) / 60, 1),
              "prompts": scores, "chosen": chosen(scores)}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
