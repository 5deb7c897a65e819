"""Calibrate the job cost (app/serving/job_cost.py) on this CPU: time page jobs of known shape, fit the
weights, and time the costliest jobs the cap admits (issue #37: "the worst admitted job is a few
seconds of the lane").

Each job runs through the page's Generate handler as it does in the one model lane: the checked
settings, the race of SkipDecode and the full model, and the page's rendering (token html every
step, the heatmap and its lens at most 4x a second). Nothing else should run on the CPU meanwhile (pause a training run: ``kill -STOP PID``).
Jobs are timed in-process (no server, no queue: the lane's own time). The fit is least squares on

    seconds = unit x (steps x (1 + row x (batch - 1)) + prompt x batch x prompt_tokens + lens x steps x lens_on) + fixed

with ``steps`` the decode steps the two streams really took (a prompt that ends early costs less
than its max_new_tokens; the cap charges max_new_tokens, the worst case). It prints one JSON
object (the CPU and its flags, threads, each job's seconds and shape, the fitted weights, the
cost formula's prediction beside each measured job, and the costliest admitted jobs at the cap
with the weights in app/serving/job_cost.py, measured and, at their full length, fitted) and writes it to
--output.

    HF_HUB_OFFLINE=1 python lab/serving/calibrate_job_cost.py --output assets/load/job_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]  # load_test, a product script, and the repository
from load_test import COUNTING, COUNTING_TOKENS, PROMPT_TEMPLATE_TOKENS, WORST_JOBS, long_prompt, words_for_cost  # noqa: E402

from app.serving import job_cost  # noqa: E402


@dataclass(frozen=True)
class JobShape:
    batch: int
    prompt_words: int  # one-token words before the counting instruction (0: the instruction alone)
    new_tokens: int
    lens: bool


# Shapes that separate the terms: decode alone, widened by the batch, prompt-heavy, lens-heavy.
CALIBRATION = (
    JobShape(1, 0, 48, False), JobShape(1, 0, 160, False), JobShape(1, 0, 256, False),
    JobShape(4, 0, 64, False), JobShape(8, 0, 48, False), JobShape(8, 0, 96, False),
    JobShape(1, 600, 8, False), JobShape(1, 1200, 8, False), JobShape(4, 300, 8, False),
    JobShape(1, 0, 64, True), JobShape(1, 0, 160, True), JobShape(1, 300, 32, True),
)


def job_values(shape: JobShape) -> dict:
    prompt = long_prompt("sea", shape.prompt_words) + COUNTING if shape.prompt_words else COUNTING.strip()
    return dict(prompt=prompt, batch_size=shape.batch, max_new_tokens=shape.new_tokens, lens=shape.lens,
                target_speedup=2.0, temperature=0.0)


def run_job(playground, shape: JobShape) -> dict:
    """One page job through the page's own handler (``Playground.generate``: the check, the race,
    the rendering with the heatmap at most 4x a second), timed from its check to its last message:
    the lane's whole hold. The handler yields once per stream step and once at the end."""
    values = job_values(shape)
    prompt_tokens = playground.checked(values).run.longest_prompt
    start = time.perf_counter()
    messages = sum(1 for _ in playground.generate(values))
    seconds = time.perf_counter() - start
    return dict(shape=asdict(shape), seconds=round(seconds, 3), prompt_tokens=prompt_tokens, steps=(messages - 1) / 2)


def features(batch: int, prompt_tokens: int, steps: float, lens: bool) -> list[float]:
    """The formula's terms, in the order of fit's coefficients (the last is the fixed cost)."""
    return [steps, steps * (batch - 1), batch * prompt_tokens, steps * lens, 1.0]


def fit(jobs: list[dict]) -> dict:
    """Least-squares weights from timed jobs: seconds per unit, then each term relative to it."""
    x = np.array([features(j["shape"]["batch"], j["prompt_tokens"], j["steps"], j["shape"]["lens"]) for j in jobs])
    y = np.array([j["seconds"] for j in jobs])
    (unit, row, prompt, lens, fixed), *_ = np.linalg.lstsq(x, y, rcond=None)
    return dict(unit_seconds=float(unit), batch_row_weight=float(row / unit), prompt_token_weight=float(prompt / unit),
                lens_token_weight=float(lens / unit), fixed_seconds=float(fixed))


def predicted_seconds(weights: dict, batch: int, prompt_tokens: int, steps: float, lens: bool) -> float:
    """The fitted formula's seconds for a job: ``features`` times fit's coefficients."""
    unit = weights["unit_seconds"]
    coefficients = (unit, unit * weights["batch_row_weight"], unit * weights["prompt_token_weight"],
                    unit * weights["lens_token_weight"], weights["fixed_seconds"])
    return sum(term * c for term, c in zip(features(batch, prompt_tokens, steps, lens), coefficients))


def worst_admitted(limit: int) -> list[JobShape]:
    """The costliest jobs the cap admits (app/serving/job_cost.py's weights): the load test's three kinds,
    each with the longest prompt that still fits."""
    template = PROMPT_TEMPLATE_TOKENS + COUNTING_TOKENS  # as the load test sizes them (10 units of margin)
    return [JobShape(job["batch_size"], words_for_cost(job["batch_size"], job["max_new_tokens"], job["lens"], limit - 10,
                                                       template), job["max_new_tokens"], job["lens"]) for job in WORST_JOBS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each calibration job (the fit takes them all)")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    import torch

    from app.handlers import Playground
    from app.settings import Limits
    from model.common.hardware import hardware_info
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    hardware = hardware_info(torch.device("cpu"))  # first: a failure here costs no measurement
    generator = TextGenerator(load_model(None, adapter="auto", quantize="auto"))  # as app.py serves it
    playground = Playground(lambda: generator, Limits(max_job_cost=10**9))  # the calibration jobs go past the cap
    run_job(playground, JobShape(1, 0, 8, False))  # warm: kernels built, caches filled
    jobs = [run_job(playground, shape) for _ in range(args.repeats) for shape in CALIBRATION]
    weights = fit(jobs)
    for job in jobs:
        shape = job["shape"]
        job["fitted_seconds"] = round(predicted_seconds(weights, shape["batch"], job["prompt_tokens"], job["steps"], shape["lens"]), 3)
    worst = []
    for shape in worst_admitted(Limits().max_job_cost):  # the server's own cap, not the calibration's
        job = run_job(playground, shape)
        job["cost_units"] = job_cost.job_cost(shape.batch, job["prompt_tokens"], shape.new_tokens, shape.lens)
        # A prompt may end before max_new_tokens; the bound is the fit at the full length (what the cap charges).
        job["fitted_seconds_at_full_length"] = round(predicted_seconds(weights, shape.batch, job["prompt_tokens"],
                                                                       shape.new_tokens, shape.lens), 3)
        worst.append(job)
    report = dict(hardware=hardware, torch_threads=torch.get_num_threads(), fitted=weights,
                  in_use=dict(unit_seconds=job_cost.UNIT_SECONDS, batch_row_weight=job_cost.BATCH_ROW_WEIGHT,
                              prompt_token_weight=job_cost.PROMPT_TOKEN_WEIGHT, lens_token_weight=job_cost.LENS_TOKEN_WEIGHT,
                              max_job_cost=Limits().max_job_cost),
                  jobs=jobs, worst_admitted=worst)
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
