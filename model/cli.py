"""Command line: ``python -m model generate --prompt TEXT [...]``.

Bad input exits with status 2 and one line ``error: ...`` on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from model.common.settings import SETTINGS_PAGE, settings_table, write_settings_table
from model.evaluation.batch_check import BatchCheckConfig, run_batch_check
from model.evaluation.bench import BenchConfig, BenchReport, run_bench, split_weight_mode, write_bench
from model.evaluation.evaluation import EvalConfig, evaluate, write_report
from model.evaluation.lowbit_check import LowBitCheckConfig, run_lowbit_check
from model.evaluation.results_page import PAGE, page_is_current, write_page
from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest, validate_request
from model.generation.schedules import ScheduleRequest
from model.loading import load_model
from model.lowbit.quantization import QUANTIZE_MODES
from model.skipdecode.decoder import SamplingConfig
from model.skipdecode.schedule import DECAY_FUNCTIONS, DEFAULT_WARMUP, LAYER_ORDERS
from model.skipdecode.skip_policy import ScheduleFloor, export_adapter, mix_adapters
from model.skipdecode.static_decoder import static_decoder
from model.studies.scaling_study import ScalingConfig, run_scaling, write_scaling
from model.studies.shape_study import ShapeConfig, run_shape_study
from model.studies.study import StudyConfig, best_arm, run_study, study_markdown
from model.tasks.e2e import parse_mr, place_swaps, restore_places, task_prompt, training_places
from model.tasks.task_models import TASKS, check_task, load_task_model, task_schedule
from model.tasks.task_report import TaskEvalConfig, run_task_eval
from model.tasks.task_training import TARGET_KINDS, TaskRun, train_task
from model.tasks.tldr_data import synthetic_titles, write_posts
from model.tasks.tldr_eval import TldrEvalConfig
from model.tasks.tldr_pick import CANDIDATE_EVERY, pick_policy
from model.tasks.tldr_report import config_from, report_stem, run_tldr_eval
from model.tasks.tldr_training import TldrRun, train_tldr_policy
from model.training.data import DEFAULT_EVAL_PROMPTS, DEFAULT_FACTS
from model.training.make_data import MakeDataConfig, make_data
from model.training.training import TrainConfig, train

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: same clear one-line form
        self.print_usage(sys.stderr)
        raise CliError(message)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model id or local folder (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--adapter", default="auto", help="skip-policy adapter folder (default: the shipped one for the default model)")
    parser.add_argument("--no-adapter", action="store_true", help="SkipDecode on the untouched model (no skip-policy adapter)")


def add_schedule_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speedup", type=float, default=2.0, help="target LAYER speedup (default 2)")
    parser.add_argument("--decay", default="linear", choices=DECAY_FUNCTIONS)
    parser.add_argument("--warmup", type=int, default=None,
                        help=f"first layers that always run (default: the adapter's trained placement; "
                             f"{DEFAULT_WARMUP} for the default model, the study's best)")
    parser.add_argument("--min-layers", type=int, default=None, help="override the solver's min layers")
    parser.add_argument("--max-layers", type=int, default=None, help="override the solver's max layers")
    parser.add_argument("--decay-length", type=int, default=None, help="steps to reach min layers (default max-new-tokens)")
    parser.add_argument("--order", default=None, choices=(*LAYER_ORDERS, "ranked"),
                        help="which layers a budget runs (default: the adapter's trained order, else warmup_top)")
    parser.add_argument("--prompt-at-budget", action="store_true", help="run the prompt at the first budget, not full depth")


def build_parser() -> argparse.ArgumentParser:
    """The command table: one subcommand per entry of COMMANDS, in that order (the help lists them so)."""
    parser = _Parser(prog="python -m model", description="SkipDecode: layer-skipping decoding with batching and KV cache")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def add_generate_command(commands) -> None:
    """`generate`: text with SkipDecode or the full model, and its options."""
    gen = commands.add_parser("generate", help="generate text with SkipDecode (or the full model with --full)")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    add_schedule_options(gen)
    gen.add_argument("--full", action="store_true", help="run the full model (every layer, every step)")
    gen.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (a task: its own budget)")
    gen.add_argument("--task", default=None, choices=TASKS,
                     help="a fine-tuned task (e2e: the paper's E2E restaurant descriptions): --prompt is an MR "
                          "as in the CSV, the task model is the full model and SkipDecode runs the task's policy")
    gen.add_argument("--delexicalised-places", action="store_true",
                     help="with --task: swap each place the task model never trained on for one it did before "
                          "decoding and write it back in the text (the E2E challenge baseline's way; the playground "
                          "always does)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string; repeatable")
    gen.add_argument("--raw", action="store_true", help="send the prompt as raw text (no chat template)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    gen.add_argument("--quantize", default="auto", choices=("auto", "none", "int8", "int4"),
                     help="low-bit weights on CPU (auto: the CPU default, none on GPU; both models alike)")
    gen.add_argument("--static-cache", action="store_true",
                     help="decode steps over a static KV cache (fixed shapes: what CUDA graphs replay), run eagerly")
    add_model_options(gen)
    gen.set_defaults(handler=run_generate)


def add_make_data_command(commands) -> None:
    """`make-data`: distillation data at scale, and its options."""
    md = commands.add_parser("make-data", help="distillation data at scale, offline: prompts from four sources and "
                             "the full model's greedy + sampled continuations (resumable)")
    add_dataclass_options(md, MakeDataConfig)
    md.set_defaults(handler=run_make_data)


def add_train_command(commands) -> None:
    """`train`: skip-policy fine-tuning, and its options."""
    tr = commands.add_parser("train", help="skip-policy fine-tuning (LoRA by default) with accelerate")
    add_dataclass_options(tr, TrainConfig)
    tr.set_defaults(handler=run_train)


def add_study_command(commands) -> None:
    """`study`: the recipe study, and its options."""
    st = commands.add_parser("study", help="the skip-policy recipe study: every arm, same budget, same held-out set")
    st.add_argument("--minutes", type=float, default=6.0, help="training CPU minutes per arm (default 6)")
    st.add_argument("--arms", default="", help="comma-separated arms (default: all)")
    st.add_argument("--threads", type=int, default=1)
    st.add_argument("--runs-dir", default="runs/study")
    st.add_argument("--output", default="assets/study")
    st.set_defaults(handler=run_study_command)


def add_scaling_command(commands) -> None:
    """`scaling`: the data-scaling curve, and its options."""
    sc = commands.add_parser("scaling", help="the data-scaling curve: the shipped recipe, same steps, on the first "
                             "N unique make-data sequences (resumable)")
    add_dataclass_options(sc, ScalingConfig)
    sc.add_argument("--report-only", action="store_true", help="rewrite scaling.json/md from the arms' logs")
    sc.set_defaults(handler=run_scaling_command)


def add_shape_study_command(commands) -> None:
    """`shape-study`: the schedule's shape judged free-running, and its options."""
    sh = commands.add_parser("shape-study", help="the schedule's shape at a fixed speedup, judged by free-running "
                             "fluency, repetition and fact retention (not ROUGE)")
    add_dataclass_options(sh, ShapeConfig)
    sh.set_defaults(handler=run_shape_study_command)


def add_export_adapter_command(commands) -> None:
    """`export-adapter`: a trained adapter copied for shipping, and its options."""
    ex = commands.add_parser("export-adapter", help="copy a trained adapter for shipping, weights cast to bfloat16")
    ex.add_argument("source", help="the trained adapter folder (e.g. runs/NAME/adapter)")
    ex.add_argument("destination", help="where to write it (e.g. assets/adapters/NAME)")
    ex.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ex.add_argument("--schedule-floor", type=int, default=None, metavar="LAYERS",
                    help="record the policy's measured default shape: no step below LAYERS layers (linear decay, "
                         "speedups up to --floor-up-to); decide it with `eval --candidate-floor`")
    ex.add_argument("--floor-up-to", type=float, default=None, metavar="SPEEDUP",
                    help="the largest target speedup the schedule floor applies to")
    ex.set_defaults(handler=run_export_adapter)


def add_mix_adapters_command(commands) -> None:
    """`mix-adapters`: two skip policies interpolated, and its options."""
    mx = commands.add_parser("mix-adapters", help="an adapter whose delta is W x FIRST's + (1 - W) x SECOND's "
                             "(two skip policies of the same model interpolated), stored at one rank by SVD")
    mx.add_argument("first", help="adapter folder whose placement (training_info.json) the mix keeps")
    mx.add_argument("second", help="adapter folder of the same model, target modules and alpha / r")
    mx.add_argument("destination", help="where to write the mixed adapter")
    mx.add_argument("--weight", type=float, required=True, help="share of FIRST's delta, within [0, 1]")
    mx.add_argument("--rank", type=int, default=None, help="stored rank (default: the larger of the two)")
    mx.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    mx.set_defaults(handler=run_mix_adapters)


def add_lowbit_check_command(commands) -> None:
    """`lowbit-check`: low-bit against float weights, and its options."""
    lb = commands.add_parser("lowbit-check", help="low-bit vs float weights: teacher-forced agreement of the full "
                             "model and of SkipDecode (adapter), through the cached decoder")
    add_model_options(lb)
    lb.add_argument("--quantize", default="int4", help="comma-separated low-bit modes (int4, int8)")
    add_agreement_options(lb, max_prompts=None, batch_help="prompts decoded together (the kernels' rows)")
    lb.set_defaults(handler=run_lowbit_check_command)


def add_agreement_options(parser: argparse.ArgumentParser, max_prompts: int | None, batch_help: str) -> None:
    """The options of a teacher-forced agreement check (lowbit-check, batch-check)."""
    parser.add_argument("--speedups", default="1,2", help="comma-separated target layer speedups (1 = full model)")
    parser.add_argument("--max-prompts", type=int, default=max_prompts)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16, help=batch_help)
    parser.add_argument("--json", default=None, help="also write the report to this file")


def add_batch_check_command(commands) -> None:
    """`batch-check`: a row of a shared batch against the same job alone, and its options."""
    bc = commands.add_parser("batch-check", help="a row of a shared batch (as the playground batches a class) "
                             "against the same job alone: teacher-forced agreement")
    add_model_options(bc)
    bc.add_argument("--quantize", default="auto", help="the weights (auto: the product's, int4 on a CPU)")
    add_agreement_options(bc, max_prompts=64, batch_help="prompts in one batch")
    bc.set_defaults(handler=run_batch_check_command)


def add_bench_command(commands) -> None:
    """`bench`: measured speed, side by side, and its options."""
    be = commands.add_parser("bench", help="measured tokens/s: transformers generate vs our full decoder vs SkipDecode")
    add_model_options(be)
    be.add_argument("--batch-sizes", default=None, help="comma-separated (default: 1,4,8,16 on CPU; 1,8,32,64 on GPU)")
    be.add_argument("--speedups", default="1.5,2,3,4", help="comma-separated target layer speedups")
    be.add_argument("--decay", default="linear", choices=DECAY_FUNCTIONS)
    be.add_argument("--tokens", type=int, default=64, help="generated tokens per row (fixed; EOS ignored)")
    be.add_argument("--repeats", type=int, default=3)
    be.add_argument("--no-hf", action="store_true", help="leave out transformers' generate")
    be.add_argument("--quick", action="store_true", help="a tiny run (tests): batch 1 and 2, 8 tokens, 1 repeat")
    be.add_argument("--quantize", default=None,
                    help="comma-separated weight modes side by side: none, int8, int4, and int4@KERNEL for int4 on "
                         "one kernel (torch, avx2, avx512-vnni, amx: the last two without and with AMX tiles) "
                         "(default: none,int8,int4 on CPU, none on GPU)")
    be.add_argument("--prompt-tokens", type=int, default=512,
                    help="prompt processing and time to first token for a prompt this long (and one of 128 "
                         "tokens beside a longer one), batch 1, beside llama-bench -p (0: leave out)")
    be.add_argument("--threads", type=int, default=None, help="torch threads, and llama-bench's -t (default: torch's)")
    be.add_argument("--no-llama-cpp", action="store_true", help="leave out the llama.cpp row (scripts/build_llama_bench.sh)")
    be.add_argument("--static-cache", action="store_true",
                    help="add our decoder over the static KV cache run eagerly (the CUDA graphs' step, any device)")
    be.add_argument("--no-graphs", action="store_true",
                    help="on CUDA, leave out our CUDA graphs and transformers' static cache + torch.compile")
    be.add_argument("--no-compiled-layers", action="store_true",
                    help="leave out our compiled layers (in the CUDA graphs on CUDA; with --static-cache elsewhere)")
    be.add_argument("--output", default=None, help="folder for bench.json, bench.md and speedup.json")
    be.add_argument("--json", default=None, help="also write the raw figures to this file")
    be.set_defaults(handler=run_bench_command)


def add_eval_command(commands) -> None:
    """`eval`: quality under skipping, and its options."""
    ev = commands.add_parser("eval", help="quality under skipping on the held-out prompts, with and without the adapter")
    add_model_options(ev)
    ev.add_argument("--prompts", default=None, help="JSONL prompt set (default: assets/prompts/eval.jsonl)")
    ev.add_argument("--max-prompts", type=int, default=None)
    ev.add_argument("--tokens", type=int, default=48, help="continuation length")
    ev.add_argument("--speedups", default="1,1.5,2,3,4", help="comma-separated target layer speedups")
    ev.add_argument("--decay", default="linear", choices=DECAY_FUNCTIONS)
    ev.add_argument("--warmup", type=int, default=None, help="default: the adapter's trained placement")
    ev.add_argument("--order", default=None, choices=(*LAYER_ORDERS, "ranked"), help="default: the adapter's trained order")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--quantize", default="", help="comma-separated weight modes (int8) to measure against the "
                    "float full model (default: none)")
    ev.add_argument("--no-free-running", action="store_true",
                    help="skip the generation runs (ROUGE-L/BLEU, judged fluency, repetition, fact retention)")
    ev.add_argument("--adapter-only", action="store_true",
                    help="leave out the no-adapter rows (comparing adapters: about half the time)")
    ev.add_argument("--facts", default=None, help="JSONL fact questions with accepted answers "
                    "(default: assets/prompts/facts.jsonl; 'none' to skip)")
    ev.add_argument("--max-facts", type=int, default=None)
    ev.add_argument("--fact-tokens", type=int, default=32, help="reply length for a fact question")
    ev.add_argument("--candidate", default=None, help="a second adapter folder, measured on the same references "
                    "and compared with --adapter per measure (paired bootstrap over prompts, 95%% intervals)")
    ev.add_argument("--candidate-floor", type=int, default=None, help="or compare the SAME adapter with a schedule "
                    "floor of this many layers per step (the same layer budget, another shape), paired likewise")
    ev.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the candidate's comparison")
    ev.add_argument("--output", default=None, help="folder for eval.json and eval.md")
    ev.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    ev.set_defaults(handler=run_eval)


def add_task_subcommands(command: argparse.ArgumentParser, e2e_help: str, e2e_config: type, e2e_handler: Callable,
                         tldr_help: str, tldr_config: type, tldr_handler: Callable) -> None:
    """One subcommand per task under ``command`` (each task has its own options): the E2E-shaped tasks
    (TASKS) from ``e2e_config`` less its ``task`` field, and TL;DR from ``tldr_config``."""
    tasks = command.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in TASKS:
        one = tasks.add_parser(task, help=f"{task}: {e2e_help}")
        add_dataclass_options(one, e2e_config, skip=("task",))
        one.set_defaults(handler=e2e_handler)
    tldr = tasks.add_parser("tldr", help=tldr_help)
    add_dataclass_options(tldr, tldr_config)
    tldr.set_defaults(handler=tldr_handler)


def add_train_task_command(commands) -> None:
    """`train-task`: a task model or one of its skip policies, and its options."""
    tt = commands.add_parser("train-task", help="a task model (the paper's 1x) or one of its skip policies "
                                                "(--policy 2|3|4|5|all), trained on the task's references")
    add_task_subcommands(tt, "the task model or a skip policy, from the references or distilled", TaskRun,
                         run_train_task, "Reddit TL;DR: a skip policy for --speedup, distilled from the default "
                         "model's own TL;DRs of the distillation posts (checkpoints, --resume)", TldrRun, run_train_tldr)


def add_eval_task_command(commands) -> None:
    """`eval-task`: a task's test set at 1x and each speedup, and its options."""
    et = commands.add_parser("eval-task", help="a task's test set at 1x and each speedup: its scores and measured "
                                               "speed; writes assets/eval/<task>.json and .md")
    add_task_subcommands(et, "BLEU, ROUGE-L, NIST, facts and speed", TaskEvalConfig, run_eval_task,
                         "Reddit TL;DR (the default model prompted; each speedup's TL;DR policy where one is "
                         "shipped): ROUGE-1/2/L shares, main subject, prompt depth, speed", TldrEvalConfig,
                         run_tldr_eval_command)


def add_task_data_command(commands) -> None:
    """`task-posts tldr`: the posts the TL;DR skip policies are distilled from, written by the default model."""
    tp = commands.add_parser("task-posts", help="TL;DR: posts the default model writes from composed titles (never "
                                                "the test posts), appended as written; an interrupted run resumes")
    tp.add_argument("task", choices=("tldr",))
    tp.add_argument("--count", type=int, default=600, help="titles to write a post for (default 600)")
    tp.add_argument("--seed", type=int, default=0)
    tp.add_argument("--varied", action="store_true",
                    help="varied titles (more people, events and shapes; the test set's subreddits) instead of the composed ones")
    tp.add_argument("--batch-size", type=int, default=16)
    tp.add_argument("--max-new-tokens", type=int, default=320)
    tp.add_argument("--output", default="assets/data/tldr/distil-posts.jsonl")
    tp.set_defaults(handler=run_task_posts)


def run_task_posts(args: argparse.Namespace) -> int:
    if args.count < 1 or args.batch_size < 1 or args.max_new_tokens < 1:
        raise CliError("--count, --batch-size and --max-new-tokens must be >= 1")
    generator = TextGenerator(load_model(None, adapter="auto", quantize="auto"))  # the CPU default weights
    written = write_posts(generator, synthetic_titles(args.count, args.seed, args.varied), Path(args.output),
                          batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"wrote {written} posts to {args.output}")
    return 0


def add_pick_policy_command(commands) -> None:
    """`pick-policy tldr`: a trained run's checkpoints and the general policy on the held-out posts, by the rule."""
    pp = commands.add_parser("pick-policy", help="TL;DR: score a run's kept checkpoints and the general policy on the "
                                                 "held-out posts and ship the one the rule chooses (tldr_pick.py)")
    pp.add_argument("task", choices=("tldr",))
    pp.add_argument("--speedup", type=float, required=True)
    pp.add_argument("--run", required=True, help="the training run's folder (its adapter-step-N copies)")
    pp.add_argument("--posts", type=int, default=None, help="the first N held-out posts (quick runs; default all 100)")
    pp.add_argument("--device", default="auto")
    pp.add_argument("--every", type=int, default=CANDIDATE_EVERY,
                    help=f"score the checkpoints at multiples of this many steps (default {CANDIDATE_EVERY}, the rule's)")
    pp.set_defaults(handler=run_pick_policy)


def run_pick_policy(args: argparse.Namespace) -> int:
    if not Path(args.run).is_dir():
        raise CliError(f"--run {args.run} is not a folder")
    if args.every < 1:
        raise CliError("--every must be >= 1")
    entry = pick_policy(Path(args.run), args.speedup, posts=args.posts, device=args.device, every=args.every)
    subject = entry["full_subject"]
    print(f"{'1x':>22}  ROUGE-L {entry['full_rouge_l']:6.2f}" + (f"  main subject {subject:5.1f}%" if subject is not None else ""))
    for candidate in entry["candidates"]:
        named = candidate["subject"]
        print(f"{candidate['name']:>22}  ROUGE-L {candidate['rouge_l']:6.2f}  share {candidate['share']:.4f}"
              + (f"  main subject {named:5.1f}%" if named is not None else "")
              + (f"  ({candidate['shape']} shape)" if candidate.get("shape", "linear") != "linear" else ""))
    print(f"chosen: {entry['chosen']}" + (f" (exported to {entry['exported']})" if entry["exported"] else ""))
    return 0


def add_results_command(commands) -> None:
    """`results`: docs/RESULTS.md, today's figures, from the committed JSON under assets/."""
    rs = commands.add_parser("results", help="write docs/RESULTS.md (today's figures) from the committed JSON under "
                                             "assets/; --check: exit 1 where the page differs")
    rs.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page differs from the JSON's")
    rs.add_argument("--output", default=None, help=f"the page to write or check (default: {PAGE})")
    rs.set_defaults(handler=run_results_command)


def add_settings_table_command(commands) -> None:
    """`settings-table`: the environment settings as docs/SERVING.md's table, from model/common/settings.py."""
    st = commands.add_parser("settings-table", help="print the environment settings' table (variable, default, what "
                                                    "it does); --write: regenerate it in docs/SERVING.md")
    st.add_argument("--write", action="store_true", help=f"rewrite the table in {SETTINGS_PAGE.name} in place")
    st.set_defaults(handler=run_settings_table_command)


def run_settings_table_command(args: argparse.Namespace) -> int:
    if not args.write:
        print(settings_table(), end="")
    elif write_settings_table():
        print(f"{SETTINGS_PAGE}: settings table regenerated")
    else:
        print(f"{SETTINGS_PAGE}: settings table already current")
    return 0


# The commands, in the order `python -m model --help` lists them.
COMMANDS = (add_generate_command, add_make_data_command, add_train_command, add_eval_command, add_study_command, add_scaling_command, add_shape_study_command, add_export_adapter_command, add_mix_adapters_command, add_bench_command, add_lowbit_check_command,
            add_batch_check_command,
            add_train_task_command, add_eval_task_command, add_task_data_command, add_pick_policy_command,
            add_results_command,
            add_settings_table_command)


def run_results_command(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else None
    if not args.check:
        print(write_page(output=output))
        return 0
    if page_is_current(page=output):
        print(f"{output or PAGE}: up to date with the JSON under assets/")
        return 0
    print(f"error: {output or PAGE} differs from what the JSON under assets/ gives: run `python -m model results`",
          file=sys.stderr)
    return 1


def run_lowbit_check_command(args: argparse.Namespace) -> int:
    modes = tuple(m for m in (_quantize_list(args.quantize) or ()) if m != "none")
    if not modes or args.tokens < 2 or args.batch_size < 1:
        raise ValueError("--quantize needs a low-bit mode (int4, int8), --tokens must be >= 2 and --batch-size >= 1")
    config = LowBitCheckConfig(quantize=modes, speedups=_float_list(args.speedups, "--speedups"),
                               max_prompts=args.max_prompts, tokens=args.tokens, model=args.model,
                               adapter=None if args.no_adapter else args.adapter, batch_size=args.batch_size)
    report = run_lowbit_check(config, progress=lambda line: print(line, file=sys.stderr))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    print(report.to_markdown())
    return 0


def run_batch_check_command(args: argparse.Namespace) -> int:
    if args.tokens < 2 or args.batch_size < 1 or (args.max_prompts is not None and args.max_prompts < 1):
        raise ValueError("--tokens must be >= 2, --batch-size and --max-prompts >= 1")
    config = BatchCheckConfig(speedups=_float_list(args.speedups, "--speedups"), max_prompts=args.max_prompts,
                              tokens=args.tokens, batch_size=args.batch_size, model=args.model,
                              adapter=None if args.no_adapter else args.adapter, quantize=args.quantize)
    report = run_batch_check(config, progress=lambda line: print(line, file=sys.stderr))
    if args.json:
        recorded = {"command": " ".join(["python -m model", *sys.argv[1:]]), **report.to_json()}
        Path(args.json).write_text(json.dumps(recorded, indent=2) + "\n")
    print(report.to_markdown())
    return 0


def run_study_command(args: argparse.Namespace) -> int:
    config = StudyConfig(minutes=args.minutes, arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()),
                         threads=args.threads, runs_dir=args.runs_dir, output=args.output)
    study = run_study(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(study_markdown(study))
    print(f"\nbest at 2x: {best_arm(study)}")
    return 0


def run_shape_study_command(args: argparse.Namespace) -> int:

    config = ShapeConfig(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(ShapeConfig)})
    run_shape_study(config, lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def run_scaling_command(args: argparse.Namespace) -> int:

    config = ScalingConfig(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(ScalingConfig)})
    report = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.report_only:
        write_scaling(config, report)
    else:
        run_scaling(config, report)
    return 0


def run_export_adapter(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    if (args.schedule_floor is None) != (args.floor_up_to is None):
        raise ValueError("--schedule-floor and --floor-up-to go together")
    floor = None if args.schedule_floor is None else ScheduleFloor(args.schedule_floor, args.floor_up_to)
    written = export_adapter(args.source, args.destination, getattr(torch, args.dtype), schedule_floor=floor)
    for path in written:
        print(f"{path}  {path.stat().st_size / 1e6:.2f} MB")
    print(f"total {sum(p.stat().st_size for p in written) / 1e6:.2f} MB")
    return 0


def run_mix_adapters(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    if args.rank is not None and args.rank < 1:
        raise ValueError(f"--rank must be at least 1, got {args.rank}")
    mixed = mix_adapters(args.first, args.second, args.destination, args.weight, args.rank, getattr(torch, args.dtype))
    print(f"{mixed.destination}: rank {mixed.rank}, energy of the mixed deltas kept: "
          f"min {mixed.kept_energy_min:.4f}, mean {mixed.kept_energy_mean:.4f}")
    return 0


def _quantize_list(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    modes = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [m for m in modes if m not in QUANTIZE_MODES]
    if unknown or not modes:
        raise ValueError(f"--quantize takes {', '.join(QUANTIZE_MODES)} (comma-separated); got {text!r}")
    return modes


def _bench_weight_modes(text: str | None) -> tuple[str, ...] | None:
    """--quantize for the bench: weight modes, int4 also with its kernel (int4@avx2)."""
    if not text:
        return None
    modes = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    _quantize_list(",".join(split_weight_mode(m)[0] for m in modes))  # each mode's weights known (and a kernel's)
    return modes


def run_bench_command(args: argparse.Namespace) -> int:
    if args.tokens < 2 or args.repeats < 1 or (args.threads is not None and args.threads < 1):
        raise ValueError("--tokens must be >= 2, --repeats and --threads >= 1")
    if args.prompt_tokens < 0:
        raise ValueError("--prompt-tokens must be >= 0")
    batch_sizes = tuple(int(b) for b in _float_list(args.batch_sizes, "--batch-sizes")) if args.batch_sizes else None
    if batch_sizes and min(batch_sizes) < 1:
        raise ValueError("--batch-sizes must be >= 1")
    config = BenchConfig(model=args.model, adapter=None if args.no_adapter else args.adapter, device=args.device,
                         dtype=args.dtype, batch_sizes=batch_sizes, speedups=_float_list(args.speedups, "--speedups"),
                         decay=args.decay, new_tokens=args.tokens, repeats=args.repeats, include_hf=not args.no_hf,
                         quick=args.quick, quantize=_bench_weight_modes(args.quantize), threads=args.threads,
                         llama_cpp=not args.no_llama_cpp, prompt_tokens=args.prompt_tokens,
                         static=args.static_cache, graphs=not args.no_graphs, compiled=not args.no_compiled_layers)

    def write_so_far(partial: BenchReport) -> None:  # a run stopped by a time limit keeps its finished batches
        if args.json:
            batches = sorted({row.batch_size for row in partial.rows})
            Path(args.json).write_text(json.dumps({**partial.to_json(), "stopped_after_batches": batches}, indent=2))
    report = run_bench(config, progress=lambda line: print(line, file=sys.stderr), on_batch=write_so_far)
    if args.output:
        write_bench(report, args.output)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    print(report.to_markdown())
    return 0


def _float_list(text: str, name: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers; got {text!r}") from None
    if not values:
        raise ValueError(f"{name} is empty")
    return values


def eval_config(args: argparse.Namespace) -> EvalConfig:
    """The EvalConfig an `eval` command line asks for."""
    return EvalConfig(
        model=args.model, adapter=None if args.no_adapter else args.adapter, device=args.device,
        prompts=args.prompts or str(DEFAULT_EVAL_PROMPTS), max_prompts=args.max_prompts,
        continuation_tokens=args.tokens, speedups=_float_list(args.speedups, "--speedups"), decay=args.decay,
        warmup=args.warmup, order=args.order, batch_size=args.batch_size, free_running=not args.no_free_running,
        quantize=tuple(m for m in (_quantize_list(args.quantize) or ()) if m != "none"),
        facts=None if args.facts == "none" else args.facts or str(DEFAULT_FACTS), max_facts=args.max_facts,
        fact_tokens=args.fact_tokens, include_no_adapter=not args.adapter_only, candidate=args.candidate,
        candidate_floor=args.candidate_floor, resamples=args.resamples,
    )


def run_eval(args: argparse.Namespace) -> int:
    config = eval_config(args)
    if config.continuation_tokens < 2 or config.fact_tokens < 2:
        raise ValueError("--tokens and --fact-tokens must be >= 2")
    if config.compares and not config.adapter:
        raise ValueError("a candidate is compared with an adapter: leave out --no-adapter")
    if config.resamples < 100:
        raise ValueError("--resamples must be >= 100")
    report = evaluate(config, progress=lambda line: print(line, file=sys.stderr))
    if args.output:
        write_report(report, args.output)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.to_markdown())
    return 0


# Options whose CLI name differs from the TrainConfig field (kept from earlier releases).
TRAIN_OPTION_NAMES = {"max_steps": "--steps", "learning_rate": "--lr", "warmup_layers": "--warmup"}
TRAIN_OPTION_HELP = {
    "model": "HF model id or local folder (default: embedded SmolLM2-135M-Instruct)",
    "data": "JSONL with prompt/completion or text records (default: self-distillation)",
    "prompts": "self-distillation prompt set",
    "max_minutes": "stop after this much CPU time of the process (the learning rate decays over it)",
    "samples_per_prompt": "sampled teacher continuations per prompt besides the greedy one",
    "trim_loops": "cut each target where it starts to loop (8 tokens in a row each repeating one of its 4-grams)",
    "unlikelihood": "> 0: keep the loops, KL only before them (the cut --trim-loops makes, which it implies), "
                    "and push down each token there that repeats a 4-gram, weight x -log(1 - p); its steps read "
                    "the whole targets (0 = off)",
    "flip_weight": "> 0: a target position where the student's top token is not the teacher's weighs 1 + this in "
                   "the KL; with --data (and train-task), not the text's in the cross-entropy (0 = off)",
    "sequence_shares": "comma-separated share of each --sequences folder in the batches, whatever their sizes "
                       "(default: uniform over all sequences)",
    "decays": "comma-separated decays to draw schedules from",
    "schedule_mix": "broad: uniform 1.5-4x and decays; focused: 1.5-3x, linear 60%%",
    "fixed_speedup": "train one fixed schedule (the paper's way)",
    "warmup_layers": "warmup layers of the trained schedules",
    "lora_modules": "comma-separated module names to adapt (default: every linear of the layers)",
    "gate_lora": "LoRA only where a position bypasses layers, so full depth is the original model",
    "bridge_rank": "rank of the learned entry bridge (0 = none)",
    "hidden_weight": "weight of hidden-state matching (entry + final) next to the KL (0 = off)",
    "eval_every": "held-out curve every N steps (0 = off)",
    "resume": "continue from the newest checkpoint in --output-dir",
    "init_adapter": "start from this trained adapter folder's weights (same rank, alpha, modules; new optimiser)",
    "threads": "CPU threads for torch",
    "delexicalised_places": "eval-task: swap each place the training MRs never name for one they do before "
                            "decoding and back after (the challenge baseline's delexicalisation); its own report, "
                            "<task>-delexicalised.json",
    "policy_free_arms": "eval-task: also the task model skipping without a policy at each speedup",
    "targets": "what a skip policy learns to write: the references (the paper's way) or the task model's own "
               "greedy descriptions (sequence-level distillation)",
    "synthetic_mrs": "new MRs (devset names, the challenge's closed values) described by the task model, "
                     "with --targets task-model",
    "invented_places": "the share of the --synthetic-mrs about invented places (in no devset or test MR), so "
                       "that a policy learns to copy a place from the prompt, with --targets task-model",
    "invented_style": "with --invented-places: the 256 fixed names (fixed) or a fresh name of any shape for "
                      "nearly every MR (varied), which cannot be learned by heart",
    "complete_references": "only the references that mention every fact of their MR (an MR none of whose do keeps "
                           "them all): the devset's annotators left facts out, and greedy decoding learns the "
                           "likeliest wording, with --targets references",
    "targets_file": "with --targets task-model: a distillation file made before from the same task weights, MRs "
                    "and seed on any device (a GPU's distilled.jsonl and its .source.json), instead of a new pass",
    "summaries_file": "TL;DR: the task model's greedy TL;DRs of the distillation posts, made there once (with "
                      "its .source.json) and reused by every speedup and every resumed run",
    "posts_file": "TL;DR: the distillation posts (task-posts tldr); only the usable ones are summarised",
    "export": "a folder to export the final adapter to (bfloat16)",
    "kl_weight": "with text targets: cross-entropy + this weight x KL to the model without the adapter (0 = off)",
    "rerun": "eval-task tldr: run only these speedups again (comma-separated; their policies changed) and keep the "
             "other arms' summaries and speed rows from the report in --output, made on this machine with the same settings",
    "from_shipped": "TL;DR: start each speedup from its shipped policy (assets/adapters/tldr/skip-<S>x), a second round",
    "then": "TL;DR: comma-separated speedups trained after --speedup in the same process, each in its own run "
            "folder, sharing the prompts' prefill",
    "relexicalised": "rewritten copies of each training MR and its references with another eatType and food "
                     "(pubs, restaurants, the seven cuisines the test set asks for), with --targets references",
}


def add_dataclass_options(parser: argparse.ArgumentParser, config_class: type, skip: tuple[str, ...] = ()) -> None:
    """One option per field of a config dataclass (less ``skip``), its default and type taken from the dataclass."""

    for spec in dataclasses.fields(config_class):
        if spec.name in skip or not spec.init:
            continue
        flag = TRAIN_OPTION_NAMES.get(spec.name, "--" + spec.name.replace("_", "-"))
        default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
        kind = str(spec.type)
        help_text = TRAIN_OPTION_HELP.get(spec.name, "")
        help_text = f"{help_text} (default {default})".strip() if default not in (None, "", ()) else help_text
        if kind == "bool":
            parser.add_argument(flag, dest=spec.name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif kind.startswith("tuple[float, ...]"):
            parser.add_argument(flag, dest=spec.name, default=default, help=help_text,
                                type=lambda text: tuple(float(t) for t in text.split(",") if t.strip()))
        elif kind.startswith("tuple[float"):
            parser.add_argument(flag, dest=spec.name, type=float, nargs=2, default=default, help=help_text)
        elif kind.startswith("tuple[int"):
            parser.add_argument(flag, dest=spec.name, default=default, help=help_text,
                                type=lambda text: tuple(int(t) for t in text.split(",") if t.strip()))
        elif kind.startswith("tuple[str"):
            parser.add_argument(flag, dest=spec.name, default=default, help=help_text,
                                type=lambda text: tuple(t.strip() for t in text.split(",") if t.strip()))
        else:
            cast = int if kind.startswith("int") else float if kind.startswith("float") else str
            choices = {"order": (*LAYER_ORDERS, "ranked"), "fixed_decay": DECAY_FUNCTIONS,
                       "targets": TARGET_KINDS}.get(spec.name)
            parser.add_argument(flag, dest=spec.name, type=cast, default=default, choices=choices, help=help_text)


def run_make_data(args: argparse.Namespace) -> int:

    config = MakeDataConfig(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(MakeDataConfig)})
    manifest = make_data(config)
    print(f"{manifest.sequences} sequences ({manifest.target_tokens} target tokens) from {manifest.prompts_done} "
          f"of {manifest.prompts} prompts in {config.output_dir}; by source: {manifest.prompts_by_source}")
    return 0


def run_train(args: argparse.Namespace) -> int:

    values = {spec.name: getattr(args, spec.name) for spec in dataclasses.fields(TrainConfig)}
    values["speedup_range"] = tuple(values["speedup_range"])  # argparse gives a list
    result = train(TrainConfig(**values))
    print(f"trained {result.steps} steps in {result.seconds:.0f} s; adapter: {result.output_dir}/adapter")
    return 0


def load_model_from_args(args: argparse.Namespace):
    adapter = None if args.no_adapter else args.adapter
    return load_model(args.model, device=args.device, dtype=args.dtype, adapter=adapter,
                      quantize=getattr(args, "quantize", "none"))


def run_train_task(args: argparse.Namespace) -> int:

    run = TaskRun(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(TaskRun)})
    summary = train_task(run)
    print(json.dumps({"steps": summary["steps"], "seconds": summary["seconds"], "heldout": summary["heldout"],
                      "heldout_relexicalised": summary.get("heldout_relexicalised"),
                      "adapter": str(run.folder / "adapter"), "exported": summary.get("exported")}))
    return 0


def run_train_tldr(args: argparse.Namespace) -> int:
    run = TldrRun(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(TldrRun)})
    for result in train_tldr_policy(run):
        print(json.dumps({"steps": result.steps, "seconds": result.seconds, "adapter": f"{result.output_dir}/adapter"}))
    return 0


def run_tldr_eval_command(args: argparse.Namespace) -> int:
    config = config_from(vars(args))
    report = run_tldr_eval(config, command="python -m model " + " ".join(sys.argv[1:]))
    print(f"wrote {config.output}/{report_stem(config)}.json, .md and -outputs.jsonl ({report['minutes']} min)")
    return 0


def run_eval_task(args: argparse.Namespace) -> int:

    config = TaskEvalConfig(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(TaskEvalConfig)})
    report = run_task_eval(config)
    minutes = report["updates"][-1]["minutes"] if config.update else report["minutes"]  # this run's, not the report's first
    print(f"wrote {config.output}/{config.task}*.json and .md ({minutes} min)")
    return 0


# Options a task fixes itself (its policies were trained on one schedule shape and one prompt).
TASK_FIXED_OPTIONS = ("decay", "warmup", "min_layers", "max_layers", "decay_length", "order", "prompt_at_budget",
                      "temperature", "model", "raw")


def run_task_generate(args: argparse.Namespace) -> int:
    """``generate --task e2e --prompt MR``: one description per MR, the task model at --full, else
    SkipDecode with the task's policy for --speedup (the shared policy where none was trained for it)."""
    defaults = build_parser().parse_args(["generate", "--prompt", "x"])
    changed = [name for name in TASK_FIXED_OPTIONS if getattr(args, name) != getattr(defaults, name)]
    if changed:
        raise CliError(f"--task fixes the schedule and prompt its policies were trained on: leave out "
                       f"{', '.join('--' + n.replace('_', '-') for n in changed)}")
    for mr in args.prompt:
        parse_mr(mr)
    settings = check_task(args.task)
    speedup = 1.0 if args.full else args.speedup
    loaded = load_task_model(args.task, speedup, policy=None if args.no_adapter else "auto", device=args.device,
                             dtype=args.dtype, quantize=args.quantize)
    generator = with_static_cache(TextGenerator(loaded), args.static_cache)
    swaps = place_swaps(args.prompt, training_places() if args.delexicalised_places else None)
    request = GenerationRequest(prompts=tuple(task_prompt(swap.mr) for swap in swaps),
                                schedule=task_schedule(args.task, speedup, generator.num_layers, full=args.full,
                                                       skip_policy=not args.no_adapter),
                                max_new_tokens=args.max_new_tokens or settings.max_new_tokens,
                                sampling=SamplingConfig(), stop=tuple(args.stop))
    validate_request(request)
    generator.schedules.schedule_for(request.schedule, request.max_new_tokens)
    result = generator.generate(request)
    if args.delexicalised_places:  # the texts and prompts as the caller wrote the MRs
        result = dataclasses.replace(result, prompts=[task_prompt(mr) for mr in args.prompt],
                                     outputs=[restore_places(text, swap.swaps) for text, swap in zip(result.outputs, swaps)])
    return print_result(result, args.json)


def run_generate(args: argparse.Namespace) -> int:
    if args.task:
        return run_task_generate(args)
    if args.delexicalised_places:
        raise CliError("--delexicalised-places swaps a task's places: it needs --task")
    if args.max_new_tokens is None:
        args.max_new_tokens = 64
    request = GenerationRequest(
        prompts=tuple(args.prompt),
        schedule=ScheduleRequest(
            target_speedup=args.speedup,
            decay=args.decay,
            warmup=args.warmup,
            min_layers=args.min_layers,
            max_layers=args.max_layers,
            decay_length=args.decay_length,
            order=args.order,
            prompt_at_full_depth=not args.prompt_at_budget,
            full=args.full,
        ),
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed),
        raw=args.raw,
        stop=tuple(args.stop),
    )
    validate_request(request)  # prompt and number checks before the (slow) model load
    generator = with_static_cache(TextGenerator(load_model_from_args(args)), args.static_cache)
    generator.schedules.schedule_for(request.schedule, request.max_new_tokens)  # reject bad settings before work
    return print_result(generator.generate(request), args.json)


def with_static_cache(generator: TextGenerator, wanted: bool) -> TextGenerator:
    """--static-cache: both decoders (the full model and SkipDecode) step over a static KV cache."""
    if wanted:
        generator.full_decoder = static_decoder(generator.full_decoder)
        generator.skip_decoder = static_decoder(generator.skip_decoder)
    return generator


def print_result(result, as_json: bool) -> int:
    """The outputs as text (the speedups on stderr), or one JSON object."""
    if as_json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
        return 0
    for index, text in enumerate(result.outputs):
        if len(result.outputs) > 1:
            print(f"--- [{index + 1}] {result.prompts[index]}")
        print(text.strip())
    summary = result.to_json()
    print(
        f"\n[{summary['model']} on {summary['device']}: layer speedup {summary['planned_layer_speedup']:.2f}x "
        f"(achieved {summary['achieved_layer_speedup']:.2f}x over the {len(result.layers_per_step)} steps that ran), "
        f"cost-model {summary['planned_cost_model_speedup']:.2f}x, {summary['tokens_per_second']:.1f} tokens/s]",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        args = build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except (CliError, ValueError, FileNotFoundError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
