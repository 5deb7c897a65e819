"""docs/RESULTS.md, today's figures, made from the committed JSON under assets/ by one command:
``python -m model results`` writes the page, ``python -m model results --check`` fails where the
committed page differs from what the JSON gives (tests/project/test_results_page.py runs the same).

Every table row names its source (S1, S2, ...); the page's last section gives each source's file, the
command that wrote it and the hardware the file records. A JSON that records no command takes the
command the lab notebook (docs/history/RESULTS-history.md) wrote down for it, and says so; one that
records no hardware says "not recorded". Nothing here measures anything: it only reads and formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path("docs") / "RESULTS.md"
NOT_RECORDED = "not recorded"
NONE_CELL = "–"


@dataclass(frozen=True)
class Source:
    """One committed JSON the page reads, and the command the notebook gave for it (None: the JSON's own)."""

    path: str
    documented_command: str | None = None
    documented_in: str = "the notebook"


SOURCES: tuple[Source, ...] = (
    Source("assets/eval/e2e-delexicalised.json",
           "python -m model eval-task e2e --delexicalised-places --no-baselines --no-policy-free-arms --speed-mrs 0 "
           "--device cpu --threads 2 --batch-size 64 --output OUT"),
    Source("assets/eval/e2e-facts.json", "PYTHONPATH=. python scripts/e2e_facts_table.py --write", "the script's usage"),
    Source("assets/eval/e2e-delexicalised-default.json",
           "python -m model eval-task e2e --delexicalised-places --weights default --no-baselines "
           "--no-policy-free-arms --speed-mrs 0 --device cpu --threads 2 --batch-size 32 --output OUT"),
    Source("assets/eval/e2e.json",
           "python -m model eval-task e2e --speed-mrs 0 --device cpu --threads 2 --batch-size 64 --output OUT"),
    Source("assets/eval/eval.json", "python -m model eval --output assets/eval"),
    Source("assets/eval/int8/eval.json",
           "python -m model eval --quantize int8 --no-free-running --speedups 1 --no-adapter"),
    Source("assets/bench/engine2/lowbit-check-int4.json",
           "python -m model lowbit-check --quantize int4 --speedups 1,2 --json assets/bench/engine2/lowbit-check-int4.json"),
    Source("assets/bench/issue51/round9/lowbit-check-b8-zen3.json",
           "OMP_NUM_THREADS=1 python -m model lowbit-check --batch-size 8 --speedups 1,2 --json "
           "assets/bench/issue51/round9/lowbit-check-b8-zen3.json"),
    Source("assets/bench/issue51/round9/readme-zen3-t1.json",
           "python -m model bench --batch-sizes 1 --speedups 2 --quantize int4 --threads T --tokens 128 --repeats 3 "
           "--no-hf --prompt-tokens 0"),
    Source("assets/bench/issue51/round9/readme-zen3-t2.json",
           "python -m model bench --batch-sizes 1 --speedups 2 --quantize int4 --threads T --tokens 128 --repeats 3 "
           "--no-hf --prompt-tokens 0"),
    Source("assets/bench/engine2/b1-t1.json",
           "python -m model bench --batch-sizes 1 --speedups 2 --quantize int4 --threads T --tokens 128 --repeats 3 "
           "--no-hf --prompt-tokens 512 --json assets/bench/engine2/b1-tT.json"),
    Source("assets/bench/engine2/b1-t2.json",
           "python -m model bench --batch-sizes 1 --speedups 2 --quantize int4 --threads T --tokens 128 --repeats 3 "
           "--no-hf --prompt-tokens 512 --json assets/bench/engine2/b1-tT.json"),
    Source("assets/bench/issue51/round9/round9-zen3-final.json",
           "python -m model bench --quantize int4 --speedups 2 --batch-sizes 1,4,8,16 --tokens 64 --repeats 3 --no-hf "
           "--threads 2 --prompt-tokens 512"),
    Source("assets/bench/issue51/round8/round8-t2.json",
           "python -m model bench --quantize int4,int4@avx512-vnni,int4@avx2 --speedups 2 --batch-sizes 1,4,8,16 "
           "--tokens 64 --repeats 3 --no-hf --threads 2 --prompt-tokens 512"),
    Source("assets/eval/e2e-default.json",
           "python -m model eval-task e2e --weights default --no-quality --no-baselines --device cpu --threads 2 "
           "--output OUT"),
    Source("assets/bench/cpu-threads-gpu-host.json",
           "python scripts/thread_scaling.py --threads 1,2,4,8,16 --tokens 64 --repeats 3"),
    Source("assets/bench/gpu-h200-graphs.json",
           "python -m model bench --device cuda --dtype bfloat16 --batch-sizes 1,8,64 --speedups 2,3 --tokens 64 "
           "--repeats 3 --prompt-tokens 0"),
    Source("assets/bench/gpu-h100-bf16.json",
           "python -m model bench --device cuda --dtype bfloat16 --batch-sizes 1,8,32,64 --speedups 2 --tokens 64 "
           "--repeats 2 --no-llama-cpp"),
    Source("assets/load/class_burst_e2e.json"),
    Source("assets/load/class_burst_chat.json"),
    Source("assets/load/class_burst_alone.json"),
    Source("assets/load/classroom-batched.json"),
    Source("assets/load/classroom.json"),
    Source("assets/load/load_test-batched.json"),
    Source("assets/load/hostile-batched.json"),
    Source("assets/eval/tldr.json"),
    Source("assets/bench/lowbit-check-b8-8bit-avx2.json",
           "OMP_NUM_THREADS=1 SKIPDECODE_Q4_8BIT_ROWS=2 python -m model lowbit-check --quantize int4 --batch-size 8 "
           "--speedups 1,2 --json assets/bench/lowbit-check-b8-8bit-avx2.json (at commit f90f7be)", "the commit"),
)


class Sources:
    """The JSON files, read once, and their ids on the page (S1 for the first in SOURCES)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ids = {source.path: f"S{number}" for number, source in enumerate(SOURCES, 1)}
        self._data: dict[str, object] = {}

    def data(self, path: str):  # noqa: ANN201 - a JSON document: dict or list
        if path not in self._data:
            self._data[path] = json.loads((self.root / path).read_text())
        return self._data[path]

    def id(self, *paths: str) -> str:
        return ", ".join(self.ids[path] for path in paths)


# --- formatting ------------------------------------------------------------------------------------
def pct(share: float | None) -> str:
    return NONE_CELL if share is None else f"{share * 100:.1f}%"


def num(value: float | None, digits: int = 2) -> str:
    return NONE_CELL if value is None else f"{value:.{digits}f}"


def times(value: float | None) -> str:
    return NONE_CELL if value is None else f"{value:.2f}x"


def rate(value: float | None) -> str:
    """Tokens a second as the notebook writes them: 303.3, 2,292.8, 30,200."""
    if value is None:
        return NONE_CELL
    return f"{value:,.0f}" if value >= 10_000 else f"{value:,.1f}"


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def hardware(document: dict) -> str:
    """The hardware a JSON records, in its own words: the summary or CPU model, the GPU, the CPU flags."""
    recorded = document.get("hardware") or {}
    flags = recorded.get("cpu_flags") or document.get("cpu_flags")
    machine = recorded.get("summary") or ", ".join(
        part for part in (recorded.get("cpu_model"), recorded.get("physical_cores") and f"{recorded['physical_cores']} cores",
                          recorded.get("memory_gb") and f"{recorded['memory_gb']} GB") if part)
    parts = [machine, recorded.get("gpu") and f"host {recorded.get('cpu')}, {recorded.get('cores')} cores",
             recorded.get("torch") and f"torch {recorded['torch']}",
             recorded.get("torch_cpu_capability") and f"torch CPU capability {recorded['torch_cpu_capability']}",
             flags and "CPU flags " + " ".join(flags)]
    named = [part for part in parts if part]
    if flags and not machine:
        named.append("CPU model not recorded")
    return "; ".join(named) if named else NOT_RECORDED


def command(document: dict, source: Source) -> str:
    if document.get("command"):
        return f"`{document['command']}`"
    if source.documented_command:
        threads = (document.get("hardware") or {}).get("torch_threads")
        written = source.documented_command.replace(" T ", f" {threads} ").replace("-tT.", f"-t{threads}.") \
            if threads else source.documented_command
        return f"`{written}` (not in the JSON: as {source.documented_in} gives it)"
    return NOT_RECORDED


# --- quality ---------------------------------------------------------------------------------------
def e2e_delexicalised(sources: Sources) -> list[str]:
    path, facts_path = "assets/eval/e2e-delexicalised.json", "assets/eval/e2e-facts.json"
    report, facts = sources.data(path), sources.data(facts_path)["e2e-delexicalised"]
    rows = []
    for arm in report["arms"]:
        fact = facts.get(arm["label"], {})
        scores, shares = arm["scores"], arm["shares"]
        rows.append((arm["label"], pct(fact.get("wrong")), pct(fact.get("made up")), pct(fact.get("all right")),
                     num(scores["bleu"]), num(scores["rouge_l"]), f"{num(shares['bleu'], 3)} / {num(shares['rouge_l'], 3)}",
                     pct(arm["vs_task_model"]["same_share"]), times(arm["achieved_layer_speedup"]),
                     times(arm["cost_model_speedup"]), sources.id(path, facts_path)))
    header = ("arm", "a wrong fact", "a made-up fact", "every fact right", "BLEU", "ROUGE-L",
              "BLEU / ROUGE-L share of the task model's", "same text as the task model", "layer speedup",
              "cost-model", "source")
    intro = [f"### E2E, the paper's task: {report['test_mrs']} test MRs, {report['config']['weights']}, "
             "new places delexicalised", "",
             "As the playground runs it: a name or near place the task model never trained on is swapped for one it",
             "did before decoding and written back after, in every arm alike. The task model is the 1x; the",
             "per-speedup policies are one skip policy per target, the shared policy one for all of them.", ""]
    return intro + table(header, rows)


def e2e_other_runs(sources: Sources) -> list[str]:
    """The CPU default weights with the same swap, and float32 without it (the policies copying new places)."""
    lines = []
    for path, title in (("assets/eval/e2e-delexicalised-default.json", "on the CPU default weights (`--weights default`), "
                                                                      "new places delexicalised"),
                        ("assets/eval/e2e.json", "in float32 without the swap, the policies copying new places")):
        report = sources.data(path)
        rows = [(arm["label"], f"{num(arm['scores']['bleu'])} / {num(arm['scores']['rouge_l'])}",
                 f"{num(arm['shares']['bleu'], 3)} / {num(arm['shares']['rouge_l'], 3)}", pct(arm["scores"].get("facts")),
                 pct(arm["scores"].get("made_up")), pct(arm["vs_task_model"]["same_share"]), sources.id(path))
                for arm in report["arms"]]
        lines += [f"### E2E {title}: {report['test_mrs']} test MRs", ""]
        lines += table(("arm", "BLEU / ROUGE-L", "shares of the task model's", "every fact mentioned",
                        "a fact made up", "same text as the task model", "source"), rows)
    return lines


def tldr_summaries(sources: Sources) -> list[str]:
    """Reddit TL;DR: each arm's ROUGE and its share of the 1x arm's, the main subject, and the speed rows."""
    path = "assets/eval/tldr.json"
    report = sources.data(path)
    policies = report.get("policies", {})
    rows = []
    for arm in report["arms"]:
        scores, share = arm["scores"], (arm.get("shares") or {}).get("rougeL")
        interval = f"{num(share['share'], 3)} [{num(share['low'], 3)}, {num(share['high'], 3)}]" if share else "1"
        policy = policies.get(f"{arm['speedup']:g}x") if arm["speedup"] != 1.0 else None
        rows.append((arm["label"], f"{num(scores['rouge1'])} / {num(scores['rouge2'])} / {num(scores['rougeL'])}",
                     interval, pct(arm["names_main_subject"]), pct(arm["repetition"]), policy or NONE_CELL,
                     num(arm["mean_layers_per_step"], 1), str(arm["prefill_layers"]), sources.id(path)))
    speed = [(f"{row['speedup']:g}x", "full depth" if row["prompt_at_full_depth"] else "first budget",
              times(row["decode_speedup"]), times(row["end_to_end_speedup"]),
              f"{num(row['full_first_token_s'], 3)} s / {num(row['skip_first_token_s'], 3)} s", times(row["cost_model_bound"]),
              sources.id(path)) for row in report["speed"]]
    intro = [f"### Reddit TL;DR, the paper's second task: {report['posts_scored']} reported test posts, "
             f"{report['weights']} weights", "",
             "The task model is the default model prompted for a TL;DR (no training split is available here; the",
             "paper fine-tuned one). ROUGE-1/2/L F1 x 100 against the human TL;DR; the share is of the 1x arm's",
             "ROUGE-L with its 95% paired bootstrap interval over posts; the main subject is the reference's people",
             "and the event words its title and reference share (model/tasks/tldr.py).", ""]
    kept = report.get("kept")
    if kept:
        rerun = ", ".join(f"{speedup:g}x" for speedup in kept["speedups_rerun"])
        intro += [f"Only {rerun} ran in the source's command (the policies that changed); the other arms' summaries",
                  "(scored again) and speed rows are those of", f"`{kept['from_command']}`, on the same machine.", ""]
    quality = table(("arm", "ROUGE-1 / 2 / L", "ROUGE-L share of 1x", "names the main subject", "repeated 4-grams",
                     "skip policy", "layers a step", "prompt layers", "source"), rows)
    first = report["speed"][0] if report["speed"] else {}
    speed_intro = ["", f"Speed at batch 1 (a visitor's request): {first.get('mrs', '?')} posts, {first.get('steps', '?')} "
                   "decode steps each with EOS ignored, both arms the same steps; the whole request counts the ~330-token",
                   "prompt's prefill, which runs at full depth unless the prompt is put at the schedule's first budget.", ""]
    return intro + quality + speed_intro + table(("target", "prompt", "decode speedup", "whole request",
                                                  "first token: 1x / SkipDecode", "cost-model bound", "source"), speed)


def general_chat(sources: Sources) -> list[str]:
    path = "assets/eval/eval.json"
    report = sources.data(path)
    rows = [(row["variant"], f"{row['target_speedup']:g}x", times(row["layer_speedup"]),
             f"{row['max_layers']}→{row['min_layers']}", num(row["agreement"], 3), num(row["perplexity_ratio"]),
             num(row.get("judged_ppl_ratio")), num(row.get("repetition"), 3), num(row.get("fact_retention"), 3),
             num(row.get("fact_recall"), 3), sources.id(path)) for row in report["rows"]]
    intro = ["### General chat: one skip policy for every prompt", "",
             f"{report['num_prompts']} held-out prompts, {report['continuation_tokens']}-token greedy continuations of "
             f"the full model ({report['model']}),",
             f"{report['facts']} fact questions. \"adapter\" is the shipped skip policy, \"no adapter\" the untouched "
             "model skipping",
             "the same layers. Agreement: teacher-forced next-token agreement with the full model; judged ppl ratio:",
             "the full model's perplexity of SkipDecode's own text over its own; repetition: repeated word 4-grams",
             f"(the full model's own: {report['full_repetition']}).", ""]
    header = ("variant", "target", "layer speedup", "max→min layers", "agreement", "ppl ratio", "judged ppl ratio",
              "repetition", "fact answers kept", "fact recall", "source")
    return intro + table(header, rows)


def low_bit_quality(sources: Sources) -> list[str]:
    int8_path = "assets/eval/int8/eval.json"
    rows = [(entry["weights"], "the full model", num(entry["agreement"], 3), NONE_CELL,
             f"{sources.data(int8_path)['num_prompts']} prompts", sources.id(int8_path))
            for entry in sources.data(int8_path)["quantization"]]
    checked = (("assets/bench/engine2/lowbit-check-int4.json", None),
               ("assets/bench/issue51/round9/lowbit-check-b8-zen3.json", None),
               # 8-bit activations: below the 0.99 bar, not shipped
               ("assets/bench/lowbit-check-b8-8bit-avx2.json", "int4, 8-bit activations (rejected)"))
    for path, label in checked:
        checks = {row["target_speedup"]: row for row in sources.data(path)["rows"]}
        rows.append((label or checks[1.0]["weights"], "the full model (1x), SkipDecode with the policy (2x)",
                     num(checks[1.0]["agreement"], 4), num(checks[2.0]["agreement"], 4),
                     f"{checks[1.0]['positions']} positions", sources.id(path)))
    return (["### Low-bit weights against float32", "",
             "Teacher-forced agreement with the float32 model on the held-out prompts. The product's q4 kernels "
             "keep 16-bit activations: 8-bit ones, tried at batch 8 on AVX2 (Zen 3), fell below the 0.99 bar.", ""]
            + table(("weights", "what is compared", "agreement at 1x", "at 2x", "measured over", "source"), rows))


# --- speed -----------------------------------------------------------------------------------------
def bench_row(report: dict, mode: str, batch: int = 1, weights: str = "int4", speedup: float | None = None) -> dict:
    """The bench row of one mode (llama.cpp's whatever its weights), or {} where the run has none."""
    for row in report["rows"]:
        if (row["mode"] == mode and row["batch_size"] == batch and row.get("target_speedup") == speedup
                and (mode == "llama.cpp" or row.get("weights", weights) == weights)):
            return row
    return {}


def against_llama(row: dict) -> str:
    if not row:
        return NONE_CELL
    ratio = row.get("vs_llama_cpp")
    return rate(row["decode_tokens_per_second"]) + ("" if ratio is None else f" ({ratio:.2f}x)")


def cpu_kind(report: dict) -> str:
    """The CPU and its vector extensions, as the JSON's flags give them (under its hardware or beside it)."""
    recorded = report.get("hardware") or {}
    flags = set(recorded.get("cpu_flags") or report.get("cpu_flags") or ())
    kind = "AVX-512" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else "flags not recorded"
    name = recorded.get("cpu") or recorded.get("cpu_model") or NOT_RECORDED
    # AVX-VNNI tells two CPUs of one marketing name apart (a Zen 5 EPYC has it, a Zen 4 one does not)
    extras = [label for flag, label in (("avx_vnni", "AVX-VNNI"), ("amx_tile", "AMX")) if flag in flags]
    return ", ".join([name, kind, *extras])


def prompt_against_llama(report: dict, tokens: int, weights: str = "int4") -> str:
    for prompt in report.get("prefill") or ():
        if prompt["weights"] == weights and prompt["prompt_tokens"] == tokens:
            return f"{rate(prompt['tokens_per_second'])} ({prompt['vs_llama_cpp']:.2f}x)"
    return NONE_CELL


def cpu_batch_one(sources: Sources) -> list[str]:
    paths = ("assets/bench/issue51/round9/readme-zen3-t1.json", "assets/bench/issue51/round9/readme-zen3-t2.json",
             "assets/bench/engine2/b1-t1.json", "assets/bench/engine2/b1-t2.json")
    rows = []
    for path in paths:
        report = sources.data(path)
        rows.append((str(report["hardware"]["torch_threads"]), cpu_kind(report),
                     against_llama(bench_row(report, "llama.cpp")), against_llama(bench_row(report, "full")),
                     against_llama(bench_row(report, "skipdecode", speedup=2.0)), prompt_against_llama(report, 512),
                     sources.id(path)))
    intro = ["### The int4 engine against llama.cpp, batch 1", "",
             "Decode tokens/s, the ratio to llama.cpp's `llama-bench` on the same GGUF and threads in the same run",
             f"({sources.data(paths[0])['new_tokens']} new tokens); a 512-token prompt's tokens/s against `llama-bench -p 512`.", ""]
    header = ("threads", "CPU", "llama.cpp Q4_1 full", "int4 full", "int4 SkipDecode 2x", "prompt of 512 tokens",
              "source")
    return intro + table(header, rows)


def cpu_batches(sources: Sources) -> list[str]:
    paths = ("assets/bench/issue51/round9/round9-zen3-final.json", "assets/bench/issue51/round8/round8-t2.json")
    rows, prompts = [], []
    for path in paths:
        report = sources.data(path)
        for batch in sorted({row["batch_size"] for row in report["rows"]}):
            skip = bench_row(report, "skipdecode", batch, speedup=2.0)
            rows.append((str(batch), cpu_kind(report), against_llama(bench_row(report, "llama.cpp", batch)),
                         against_llama(bench_row(report, "full", batch)), against_llama(skip),
                         times(skip.get("decode_speedup")), times(skip.get("cost_speedup")), sources.id(path)))
        prompts += [(str(tokens), cpu_kind(report), prompt_against_llama(report, tokens),
                     prompt_against_llama(report, tokens, "Q4_1").split(" (")[0], sources.id(path))
                    for tokens in sorted({prompt["prompt_tokens"] for prompt in report.get("prefill") or ()})]
    intro = ["### Batches and prompts, int4, 2 threads", "",
             "Decode tokens/s of the batch's rows (ratio to llama.cpp's `llama-batched-bench` in the same run); the",
             "2x decode speedup is SkipDecode's decode steps over full depth's, against the cost model's bound.", ""]
    return (intro + table(("batch", "CPU", "llama.cpp", "int4 full", "int4 SkipDecode 2x", "2x decode speedup",
                           "cost-model bound", "source"), rows)
            + table(("prompt tokens", "CPU", "int4 tokens/s (vs llama.cpp)", "llama.cpp tokens/s", "source"), prompts))


def e2e_speed(sources: Sources) -> list[str]:
    path = "assets/eval/e2e-default.json"
    report = sources.data(path)
    rows = [(f"{row['speedup']:g}x", str(row["batch_size"]), row["weights"], rate(row["full_decode_tps"]),
             rate(row["skip_decode_tps"]), times(row["decode_speedup"]), times(row["cost_model_bound"]),
             num(row["share_of_bound"]), times(row["end_to_end_speedup"]), sources.id(path)) for row in report["speed"]]
    first = report["speed"][0]
    intro = ["### SkipDecode's speedup on the CPU: the E2E task model and its policies", "",
             f"{first['mrs']} test MRs, {first['steps']} decode steps with EOS ignored (both arms run the same steps), "
             f"the median of {first['repeats']} repeats;", "end to end counts each prompt's prefill at full depth too.", ""]
    header = ("target", "batch", "weights", "task model decode tok/s", "SkipDecode decode tok/s", "decode speedup",
              "cost-model bound", "share of bound", "end to end", "source")
    return intro + table(header, rows)


def cpu_threads(sources: Sources) -> list[str]:
    path = "assets/bench/cpu-threads-gpu-host.json"
    rows = [(str(report["threads"]), against_llama(bench_row(report, "llama.cpp")), against_llama(bench_row(report, "full")),
             against_llama(bench_row(report, "skipdecode", speedup=2.0)),
             f"{report['limits']['read_gb_per_second']:.1f} GB/s", sources.id(path)) for report in sources.data(path)]
    return (["### Threads on a larger CPU, batch 1, int4", "",
             f"{cpu_kind(sources.data(path)[0])} ({sources.data(path)[0]['hardware']['cores']} cores, a GPU lease's host).", ""]
            + table(("threads", "llama.cpp Q4_1", "int4 full", "int4 SkipDecode 2x", "read bandwidth measured",
                     "source"), rows))


# --- GPU -------------------------------------------------------------------------------------------
def gpu_graphs(sources: Sources) -> list[str]:
    path = "assets/bench/gpu-h200-graphs.json"
    report = sources.data(path)

    def whole(mode: str, batch: int, speedup: float | None = None) -> dict:
        return bench_row(report, mode, batch, weights="float", speedup=speedup)

    rows = []
    for batch in sorted({row["batch_size"] for row in report["rows"]}):
        compiled = whole("hf_static_compile", batch)
        eager = [whole("full", batch), whole("skipdecode", batch, 2.0), whole("skipdecode", batch, 3.0)]
        graphs = [whole("graphs full", batch), whole("graphs skipdecode", batch, 2.0),
                  whole("graphs skipdecode", batch, 3.0)]
        rows.append((str(batch), rate(whole("hf_generate", batch)["tokens_per_second"]),
                     f"{rate(compiled['tokens_per_second'])} (first call {compiled['capture_seconds']:.1f} s)",
                     " / ".join(rate(row["tokens_per_second"]) for row in eager),
                     " / ".join(rate(row["tokens_per_second"]) for row in graphs),
                     " / ".join(times(row["vs_hf_static_compile"]) for row in graphs),
                     " / ".join(num(row["capture_seconds"]) for row in graphs), sources.id(path)))
    intro = [f"### CUDA graphs: {report['hardware']['gpu']}, {report['dtype']}", "",
             f"Tokens/s of the whole run ({report['new_tokens']} new tokens a row, prefill included), every mode "
             f"interleaved in one run, median of {report['repeats']}.", ""]
    header = ("batch", "transformers `generate`", "transformers static cache + `torch.compile`",
              "our eager full / 2x / 3x", "our graphs full / 2x / 3x", "graphs vs compiled", "graph capture s",
              "source")
    return intro + table(header, rows)


def gpu_eager(sources: Sources) -> list[str]:
    path = "assets/bench/gpu-h100-bf16.json"
    report = sources.data(path)
    rows = []
    for batch in sorted({row["batch_size"] for row in report["rows"]}):
        generate, full = bench_row(report, "hf_generate", batch, "float"), bench_row(report, "full", batch, "float")
        skip = bench_row(report, "skipdecode", batch, "float", 2.0)
        rows.append((str(batch), rate(generate["decode_tokens_per_second"]), rate(full["decode_tokens_per_second"]),
                     f"{rate(skip['decode_tokens_per_second'])} ({skip['max_layers']}→{skip['min_layers']})",
                     times(skip["measured_speedup"]), sources.id(path)))
    return ([f"### The eager decoder: {report['hardware']['gpu']}, {report['dtype']}", "",
             f"Decode tokens/s, {report['new_tokens']} new tokens a row, median of {report['repeats']}; the measured "
             "speedup counts the whole run.", ""]
            + table(("batch", "transformers `generate`", "our full", "SkipDecode 2x", "measured speedup 2x",
                     "source"), rows))


# --- serving ---------------------------------------------------------------------------------------
def class_bursts(sources: Sources) -> list[str]:
    rows = []
    for path in ("assets/load/class_burst_e2e.json", "assets/load/class_burst_chat.json",
                 "assets/load/class_burst_alone.json"):
        burst = sources.data(path)
        batched, alone, one_read = burst["batched"], burst["alone"], burst.get("one_read")
        rows.append((cpu_kind(burst), f"{burst['task']} at {burst['speedup']:g}x",
                     f"{burst['visitors']} x {len(batched['bursts'])}",
                     f"{batched['first_median_s']:.2f} s ({alone['first_median_s']:.2f} s)",
                     f"{batched['first_max_s']:.2f} s", f"{batched['last_done_s']:.2f} s ({alone['last_done_s']:.2f} s)",
                     f"{one_read['first_median_s']:.2f} s, {one_read['last_done_s']:.2f} s" if one_read else "not measured",
                     str(batched["largest_batch"]), f"{batched['answered_own_prompt']} of {burst['visitors']}",
                     f"{batched['rss_baseline_mb']:,} → {batched['rss_10s_after_mb']:,} MB", sources.id(path)))
    intro = ["### A class in one burst", "",
             "Visitors from as many addresses press Generate at once through the public API (medians over the",
             "bursts; in brackets the same burst with every job run alone). A shared greedy batch's prompts are read",
             "in parts, each visitor's first token shown once its part is read; beside it the same server reading",
             "them in one go (`--compare-one-read`), measured in the same run. Resident memory: before, and 10 s after.",
             ""]
    header = ("CPU (2 cores)", "task", "visitors x bursts", "first message, median", "first message, last",
              "last visitor done", "prompts read in one go: first median, last done", "largest batch",
              "answered its own prompt", "server memory", "source")
    return intro + table(header, rows)


def classrooms(sources: Sources) -> list[str]:
    rows = []
    for path in ("assets/load/classroom-batched.json", "assets/load/classroom.json"):
        room = sources.data(path)
        first, done = room["first_message_s"], room["done_s"]
        rows.append((room["date"], cpu_kind(room), f"{room['pupils_on_the_wire']} + {room['pupils_in_chromium']} in Chromium",
                     str(room["admitted_and_done"]), str(room["refused"]),
                     f"{first['median']:.2f} s ({first['max']:.2f} s)", f"{done['median']:.2f} s ({done['max']:.2f} s)",
                     f"{room['rss_mb']['before']:,.1f} → {room['rss_mb']['after']:,.1f} MB", sources.id(path)))
    return (["### A class behind one address", "",
             "Pupils on the wire and in real Chromium pages, all from one address, click Generate together on a",
             "teacher's link; median (max) seconds.", ""]
            + table(("date", "CPU (2 cores)", "pupils", "served", "refused", "first message", "done", "server memory", "source"), rows))


def load_and_hostile(sources: Sources) -> list[str]:
    load_path, hostile_path = "assets/load/load_test-batched.json", "assets/load/hostile-batched.json"
    load, hostile = sources.data(load_path), sources.data(hostile_path)
    done, normal = load["completed"], load["latency_s"]["normal"]
    largest = max(int(size) for size in load["answered_by_batch_size"])
    load_row = (f"{load['clients']} clients for {load['duration_s']:g} s", f"{sum(done.values())} requests "
                f"({done['normal']} answered in batches of up to {largest} jobs, {done['cancelled']} left mid-run, "
                f"{done['bad']} bad ones refused)",
                f"{load['server_errors']} server errors, {load['cross_session_mixups']} cross-session mix-ups",
                f"normal p50 {normal['p50']:.2f} s, p90 {normal['p90']:.2f} s",
                f"{load['server_rss_mb_before']:,.1f} → {load['server_rss_mb_after']:,.1f} MB", sources.id(load_path))
    memory, storm, errors = hostile["memory"], hostile["preview_storm"], hostile["errors_without_message"]
    hostile_row = ("the hostile mix", f"{errors['answers_checked']} answers checked",
                   f"{errors['count']} without a message; missed: {'; '.join(hostile['targets_missed']) or 'none'}",
                   f"first message during a preview storm {storm['first_message_s_during']:.2f} s "
                   f"({storm['first_message_s_alone']:.2f} s alone)",
                   f"{memory['rss_mb_before']:,.1f} → {memory['rss_mb_after_10s_idle']:,.1f} MB after 10 s idle "
                   f"({memory['idle_vs_before_percent']:+.1f}%)", sources.id(hostile_path))
    return (["### The load test and the hostile mix", "",
             "gradio_client sessions against a launched `app.py` on loopback (the load test's CPU: "
             f"{cpu_kind(load)}, load average {load['load_average_at_end']:g} at its end).", ""]
            + table(("run", "requests", "failures", "latency", "server memory", "source"), [load_row, hostile_row]))


# --- the page --------------------------------------------------------------------------------------
HEADER = """# Results: today's figures

Generated from the committed JSON under `assets/` by `python -m model results` (do not edit by hand:
tests/project/test_results_page.py regenerates the page and fails on any difference). Each row's
source (S1, S2, ...) is listed at the end with its file, the command that wrote it and the hardware
the file records; "not recorded" where the file records none. The lab notebook this page replaced,
with every dated round, the studies, the figures no JSON holds and every earlier section that other
pages cite ("round five", "Speed", "On a GPU, round three"): [the history](history/RESULTS-history.md).
"""

RESULTS_TAB = """## The Results tab

The playground's *Results* tab draws the same files:

![Results tab](../assets/images/results.png)
"""

SECTIONS: tuple[tuple[str, tuple[Callable[[Sources], list[str]], ...]], ...] = (
    ("Quality", (e2e_delexicalised, e2e_other_runs, tldr_summaries, general_chat, low_bit_quality)),
    ("Speed on the CPU", (cpu_batch_one, cpu_batches, e2e_speed, cpu_threads)),
    ("On a GPU", (gpu_graphs, gpu_eager)),
    ("Serving", (class_bursts, classrooms, load_and_hostile)),
)


def sources_section(sources: Sources) -> list[str]:
    rows = []
    for source in SOURCES:
        document = sources.data(source.path)
        first = document[0] if isinstance(document, list) else document  # a list of runs: one machine
        runs = f" (the first of {len(document)} runs; each records its own threads)" if isinstance(document, list) else ""
        rows.append((sources.ids[source.path], f"[{source.path}](../{source.path})", command(first, source),
                     hardware(first) + runs))
    return ["## Sources", ""] + table(("source", "file", "command", "hardware"), rows)


def render(root: Path = ROOT) -> str:
    """The whole page, from the JSON under ``root``."""
    sources = Sources(root)
    lines = HEADER.splitlines() + [""]
    for title, parts in SECTIONS:
        lines += [f"## {title}", ""]
        for part in parts:
            lines += part(sources)
    lines += RESULTS_TAB.splitlines() + [""] + sources_section(sources)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_page(root: Path = ROOT, output: Path | None = None) -> Path:
    target = output or root / PAGE
    target.write_text(render(root))
    return target


def page_is_current(root: Path = ROOT, page: Path | None = None) -> bool:
    target = page or root / PAGE
    return target.is_file() and target.read_text() == render(root)
