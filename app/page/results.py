"""The Results tab (plots and tables from assets/, written by the library's commands) and the
held-out figures the playground quotes under its panes."""

from __future__ import annotations

import html
import json
from functools import lru_cache
from pathlib import Path
from typing import Callable

import gradio as gr

from model.evaluation.reporting import heldout_curve_figure, quality_figure, speed_figure, study_figure
from model.loading import DEFAULT_ADAPTER
from model.training.heldout import stage_notes

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def load_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=1)
def _eval_results() -> dict | None:
    data = load_json(ASSETS / "eval" / "eval.json")
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def eval_row(target_speedup: float, skip_policy: bool) -> tuple[dict | None, int]:
    """(eval's row nearest this target speedup for this skip-policy state, held-out prompt count);
    (None, 0) when there is no eval (python -m model eval --output assets/eval writes it)."""
    data = _eval_results()
    variant = "adapter" if skip_policy else "no adapter"
    rows = [r for r in (data or {}).get("rows", []) if r.get("variant") == variant
            and isinstance(r.get("agreement"), (int, float)) and isinstance(r.get("perplexity_ratio"), (int, float))]
    if not rows:
        return None, 0
    return min(rows, key=lambda r: abs(r["target_speedup"] - target_speedup)), int(data.get("num_prompts", 0))


def results_tab(e2e_file: Path | None = None) -> None:
    """The paper's task (E2E) first; then the general chat model's quality (eval), the shipped
    adapter's held-out curve, the recipe study, speed (bench). Tables sit in a container that
    scrolls sideways on a phone (CSS class results-table)."""
    e2e_section(e2e_file or E2E_FILE, delexicalised_file(e2e_file or E2E_FILE))
    _results_section("Quality under skipping (held-out prompts)", "eval", "eval", quality_figure)
    _training_curve()
    _results_section("Which recipe: the skip-policy study", "study", "study", study_figure)
    _results_section("Measured speed", "bench", "bench", speed_figure)


def narrow_safe(figure, width: int = 26):
    """A Results figure that reads on a phone as well: titles and subplot titles wrapped onto short
    lines (side by side they overprinted at 390 px), the legend in a row under the plot."""
    title = figure.layout.title.text
    if title:
        figure.update_layout(title=dict(text=_wrap(title, width + 14), font=dict(size=14)))
    for annotation in figure.layout.annotations or ():
        subplot_title = annotation.yref == "paper" and (annotation.yanchor == "bottom" or (annotation.y or 0) >= 1)
        if annotation.text and subplot_title:  # every row's subplot titles (a 2x2 grid has them at y < 1)
            annotation.text = _wrap(annotation.text, width)
            annotation.font = dict(size=12)
    lines = max([1] + [(a.text or "").count("<br>") + 1 for a in figure.layout.annotations or ()])
    figure.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.25, x=0),
                         margin=dict(t=40 + 16 * lines + (20 if title else 0), b=90))
    return figure


def _wrap(text: str, width: int) -> str:
    """Plotly text broken into lines of at most ``width`` characters at spaces."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join(lines + [line])


def _training_curve() -> None:
    """The shipped adapter's held-out curve (heldout_curve.json next to the adapter: its training
    runs' held-out rows, one run continuing the last, written by lab/training/adapter_lineage.py)."""
    records = load_json(DEFAULT_ADAPTER / "heldout_curve.json")
    if records:
        gr.Markdown("### How the shipped skip policy was trained (held-out agreement; each dotted line "
                    "starts a run that continued the last one's adapter)")
        gr.Plot(narrow_safe(heldout_curve_figure(records, "Shipped adapter: held-out agreement")), show_label=False)
        notes = stage_notes(records)
        if notes:
            gr.Markdown("\n".join(f"* **{stage}**: {note}" for stage, note in notes))


def _results_section(title: str, folder: str, command: str, figure: Callable[[dict], object]) -> None:
    """One results block from assets/<folder>/<folder>.json and .md, written by `python -m model <command>`."""
    data = load_json(ASSETS / folder / f"{folder}.json")
    gr.Markdown(f"### {title} (`python -m model {command}`)")
    if not data:
        gr.Markdown(f"_No results under assets/{folder} yet: run `python -m model {command} --output assets/{folder}`._")
        return
    gr.Plot(narrow_safe(figure(data)), show_label=False)
    table = ASSETS / folder / f"{folder}.md"
    gr.Markdown(table.read_text() if table.is_file() else "", elem_classes=["results-table"])


# --- the paper's task: E2E (assets/eval/e2e.json, written by `python -m model eval-task e2e`) ------
E2E_FILE = ASSETS / "eval" / "e2e.json"
# The paper's claim for E2E: SkipDecode keeps this share of the task model's scores at this target
# speedup (it gives 2x and 5x; no figure in between, so 3x and 4x are shown but not judged).
PAPER_CLAIM = ((2.0, 0.99), (5.0, 0.95))
SKIP_ARMS = ("per-speedup", "shared")  # the arms that are SkipDecode with a task policy
SCORES = (("bleu", "BLEU"), ("rouge_l", "ROUGE-L"))


def load_e2e(path: Path = E2E_FILE) -> dict | None:
    """The E2E report with only well-formed arms and speed rows kept; None without one."""
    data = load_json(Path(path))
    if not isinstance(data, dict) or not isinstance(data.get("arms"), list):
        return None
    arms = [arm for arm in data["arms"] if _well_formed_arm(arm)]
    speed = [row for row in data.get("speed") or [] if isinstance(row, dict) and _is_number(row.get("speedup"))]
    return {**data, "arms": arms, "speed": speed, "facts": report_facts(Path(path))} if arms else None


FACTS_FILE = ASSETS / "eval" / "e2e-facts.json"  # scripts/e2e_facts_table.py --write, from the reports' outputs
FACT_COLUMNS = (("wrong", "a wrong fact"), ("made up", "a made-up fact"), ("all right", "every fact right"))


def report_facts(path: Path) -> dict[str, dict]:
    """{arm label: its facts on the test set} for the report at ``path`` (e2e-facts.json beside it,
    keyed by the report's name); {} where there is none."""
    data = load_json(Path(path).with_name(FACTS_FILE.name))
    facts = data.get(Path(path).stem) if isinstance(data, dict) else None
    return {label: row for label, row in facts.items() if isinstance(row, dict)} if isinstance(facts, dict) else {}


FACTS_INTRO = ("Facts first, then the scores: the share of descriptions that state a value contradicting their MR "
               "(**a wrong fact**: riverside written as the city centre), that mention an attribute the MR does not "
               "give (**a made-up fact**), and that state every fact with none wrong or made up (**every fact "
               "right**). BLEU and its share hide these: a description with one wrong word scores nearly as "
               "well as a right one. (Cue words per attribute, model/tasks/e2e_facts.py; counted from each arm's "
               "committed outputs by `python scripts/e2e_facts_table.py`.)")


def facts_intro(report: dict) -> str:
    return FACTS_INTRO if report.get("facts") else ""


def _percent(value) -> str:
    return f"{100 * value:.1f}%" if _is_number(value) else "n/a"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _well_formed_arm(arm) -> bool:
    if not isinstance(arm, dict) or not _is_number(arm.get("speedup")):
        return False
    scores, shares = arm.get("scores"), arm.get("shares")
    return (isinstance(scores, dict) and isinstance(shares, dict)
            and all(_is_number(scores.get(key)) for key, _ in SCORES))


def _text(value) -> str:
    """A value from the file as table text: no markup, no column break."""
    return html.escape(str(value), quote=False).replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def _share(value) -> str:
    return f"{value:.3f}" if _is_number(value) else "n/a"


def e2e_quality_table(report: dict) -> str:
    """Every arm: its facts (descriptions with a wrong fact, a made-up one, every fact right: when
    e2e-facts.json has them), then BLEU and ROUGE-L and their share of the task model's."""
    facts = report.get("facts") or {}
    names = [name for _, name in FACT_COLUMNS] if facts else []
    lines = ["| arm | policy | target | " + "".join(f"{name} | " for name in names) + "BLEU | ROUGE-L | BLEU share | "
             "ROUGE-L share | same text as the task model | layer speedup |", "|---" * (9 + len(names)) + "|"]
    for arm in report["arms"]:
        scores, shares = arm["scores"], arm["shares"]
        layers = arm.get("achieved_layer_speedup")
        counts = facts.get(arm.get("label")) or {}
        fact_cells = "".join(f"{_percent(counts.get(key))} | " for key, _ in FACT_COLUMNS) if facts else ""
        lines.append(f"| {_text(arm.get('label', ''))} | {_text(arm.get('policy', ''))} | {arm['speedup']:g}x | "
                     f"{fact_cells}{scores['bleu']:.2f} | {scores['rouge_l']:.2f} | {_share(shares.get('bleu'))} | "
                     f"{_share(shares.get('rouge_l'))} | {_same_text(arm.get('vs_task_model'))} | "
                     f"{f'{layers:.2f}x' if _is_number(layers) else 'n/a'} |")
    return "\n".join(lines)


def _same_text(closeness) -> str:
    """The share of MRs an arm describes word for word as the task model does ("n/a" where unknown)."""
    share = closeness.get("same_share") if isinstance(closeness, dict) else None
    return f"{100 * share:.1f}%" if _is_number(share) else "n/a"


def e2e_speed_table(report: dict) -> str:
    """Measured speed against the task model ("" without speed rows)."""
    if not report["speed"]:
        return ""
    lines = ["| target | batch | policy | weights | decode speedup | cost-model bound | end to end |",
             "|---|---|---|---|---|---|---|"]
    for row in report["speed"]:
        cells = [_speed(row.get(key)) for key in ("decode_speedup", "cost_model_bound", "end_to_end_speedup")]
        lines.append(f"| {row['speedup']:g}x | {_text(row.get('batch_size', ''))} | {_text(row.get('policy', ''))} | "
                     f"{_text(row.get('weights', ''))} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _speed(value) -> str:
    return f"{value:.2f}x" if _is_number(value) else "n/a"


def claim_verdicts(report: dict) -> list[tuple[str, float, bool, str]]:
    """(policy, speedup, holds, why) for each SkipDecode arm at a speedup the paper gives a
    share for: it holds where BOTH the BLEU and the ROUGE-L share reach the paper's."""
    verdicts = []
    for speedup, needed in PAPER_CLAIM:
        for arm in report["arms"]:
            if arm.get("policy") not in SKIP_ARMS or abs(arm["speedup"] - speedup) > 1e-9:
                continue
            shares = {name: arm["shares"].get(key) for key, name in SCORES}
            short = [f"{name} {value:.3f}" for name, value in shares.items()
                     if not _is_number(value) or value < needed]
            holds = not short
            why = (" and ".join(f"{name} {value:.3f}" for name, value in shares.items()) if holds
                   else ", ".join(short) + f" < {needed:g}")
            verdicts.append((str(arm["policy"]), speedup, holds, why))
    return verdicts


def claim_sentence(report: dict) -> str:
    """Where the paper's claim holds in this report and where it does not, in one plain paragraph."""
    (first, share), *rest = PAPER_CLAIM
    claim = (f"at least {share:g} of the task model's scores at {first:g}x"
             + "".join(f" and {later:g} at {speedup:g}x" for speedup, later in rest))
    verdicts = claim_verdicts(report)
    if not verdicts:
        return (f"The paper's claim (SkipDecode keeps {claim}) cannot be checked here: "
                "this evaluation has no SkipDecode arm at those speedups.")
    holds = [f"the {_text(policy)} policy at {speedup:g}x ({why})" for policy, speedup, ok, why in verdicts if ok]
    fails = [f"the {_text(policy)} policy at {speedup:g}x ({why})" for policy, speedup, ok, why in verdicts if not ok]
    parts = [f"The paper claims SkipDecode keeps {claim} (here: both the BLEU and the ROUGE-L share)."]
    parts.append(f"It holds for {'; '.join(holds)}." if holds else "It holds for no arm here.")
    parts.append(f"It does not hold for {'; '.join(fails)}." if fails else "It fails nowhere here.")
    return " ".join(parts)


PLAIN_TITLE = "### The paper's task: E2E restaurant descriptions (`python -m model eval-task e2e`)"
BELOW_DELEXICALISED_TITLE = ("### The same policies copying new places themselves, no swap "
                             "(`python -m model eval-task e2e`)")


def e2e_markdown(report: dict | None, title: str = PLAIN_TITLE) -> str:
    """The E2E section's text: the claim, the quality table and the speed table."""
    if report is None:
        return (f"{title}\n\nNot evaluated yet: there is no assets/eval/e2e.json. "
                "`python -m model eval-task e2e` writes it once the task's models are trained.")
    mrs = report.get("test_mrs")
    intro = (f"On {mrs:d} test MRs" if isinstance(mrs, int) else "On the test MRs") + (
        ": each score also as a share of the task model's (1x), the paper's measure.")
    speed = e2e_speed_table(report)
    return "\n\n".join(part for part in (title, claim_sentence(report), intro, facts_intro(report),
                                           e2e_quality_table(report),
                                           "Measured speed against the task model:" if speed else "", speed) if part)


def delexicalised_file(path: Path) -> Path | None:
    """The delexicalised run's report beside a plain one (eval-task --delexicalised-places); None
    for a file not named as eval-task names its reports."""
    name = Path(path).name
    return Path(path).with_name(name.replace("e2e", "e2e-delexicalised", 1)) if "e2e" in name else None


def delexicalised_markdown(report: dict) -> str:
    """The E2E section's first part: the figures of the playground's own pipeline, in which places
    the task model never trained on are swapped for known ones and written back."""
    mrs = report.get("test_mrs")
    return "\n\n".join((
        "### The paper's task, as the playground runs it: new places delexicalised "
        "(`python -m model eval-task e2e --delexicalised-places`)",
        claim_sentence(report),
        (f"On {mrs:d} test MRs" if isinstance(mrs, int) else "On the test MRs") + (
            ", every arm given a place the task model trained on in place of each name or near place it never "
            "saw (a third of the test MRs), written back in the text: the E2E challenge baseline's "
            "delexicalisation. Below it, the same policies copying those places themselves."),
        *filter(None, [facts_intro(report)]), e2e_quality_table(report)))


EARLIER_FAMILY_TITLE = ("### An earlier task model and its policies copying new places themselves, no swap "
                        "(`python -m model eval-task e2e`): not yet re-measured for the task model above, so "
                        "its shares are not comparable with those")


def _task_record(report: dict | None) -> object:
    """The task model's training record in a report (the same adapter gives the same record)."""
    return ((report or {}).get("policies") or {}).get("task")


def other_task_model(report: dict | None, other: dict | None) -> bool:
    """Whether two reports measured different task models (both records there and unequal; a
    report without the record is taken as the same)."""
    first, second = _task_record(report), _task_record(other)
    return first is not None and second is not None and first != second


def plain_title(plain: dict | None, delexicalised: dict | None) -> str:
    """The no-swap section's title: below the delexicalised one, and named an earlier family's
    where its task model is not the one the delexicalised report measured (a new task model ships
    before every report is re-run)."""
    if delexicalised is None:
        return PLAIN_TITLE
    if other_task_model(plain, delexicalised):
        return EARLIER_FAMILY_TITLE
    return BELOW_DELEXICALISED_TITLE


def e2e_section(path: Path = E2E_FILE, delexicalised_path: Path | None = None) -> None:
    delexicalised = load_e2e(delexicalised_path) if delexicalised_path else None
    if delexicalised is not None:
        gr.Markdown(delexicalised_markdown(delexicalised), elem_id="results-e2e-delexicalised",
                    elem_classes=["results-table"])
    plain = load_e2e(path)
    gr.Markdown(e2e_markdown(plain, plain_title(plain, delexicalised)), elem_id="results-e2e",
                elem_classes=["results-table"])


def e2e_note(target_speedup: float, skip_policy: bool, path: Path = E2E_FILE) -> str:
    """Under the panes for the task: what the test set says at the nearest evaluated speedup, from
    the delexicalised run (what the playground runs) where it has an arm of the kind asked for (a
    policy, or none), else the plain one."""
    delexicalised = delexicalised_file(path)
    for report_path in (p for p in (delexicalised, path) if p is not None):
        report = _cached_e2e(str(report_path))
        if report_path == path and delexicalised is not None \
                and other_task_model(report, _cached_e2e(str(delexicalised))):
            continue  # an earlier task model's figures: not what this pane runs
        note = _note_from(report, target_speedup, skip_policy)
        if note:
            return note + (" New places delexicalised, as here." if report_path != path else "")
    return "" if _cached_e2e(str(path)) else "The E2E task is not evaluated yet (Results)."


def _note_from(report: dict | None, target_speedup: float, skip_policy: bool) -> str:
    wanted = SKIP_ARMS if skip_policy else ("none",)
    arms = [a for a in (report or {}).get("arms", []) if a.get("policy") in wanted and a["speedup"] > 1]
    if not arms:
        return ""
    arm = min(arms, key=lambda a: (abs(a["speedup"] - target_speedup), SKIP_ARMS.index(a["policy"])
                                   if a["policy"] in SKIP_ARMS else 0))
    bleu, rouge = (_share(arm["shares"].get(key)) for key, _ in SCORES)
    return (f"On the E2E test set, {_text(arm.get('label', ''))}{facts_phrase(report, arm)} keeps {bleu} of the task "
            f"model's BLEU and {rouge} of its ROUGE-L (1 = no loss).")


def facts_phrase(report: dict, arm: dict) -> str:
    """' states a wrong fact in 6.8% of its descriptions, makes one up in 9.2%, gets every fact right in
    38.9% (the task model 94.9%), and' ("" without the report's facts)."""
    facts = report.get("facts") or {}
    counts, task = facts.get(arm.get("label")), facts.get("task model (1x)")
    if not counts:
        return ""
    task_share = f" (the task model {_percent(task.get('all right'))})" if task else ""
    return (f" states a <b>wrong fact in {_percent(counts.get('wrong'))}</b> of its descriptions, makes one up in "
            f"{_percent(counts.get('made up'))}, gets every fact right in {_percent(counts.get('all right'))}"
            f"{task_share}, and")


@lru_cache(maxsize=4)
def _cached_e2e(path: str) -> dict | None:
    return load_e2e(Path(path))


TLDR_FILE = ASSETS / "eval" / "tldr.json"  # python -m model eval-task tldr (model/tasks/tldr_report.py)


@lru_cache(maxsize=4)
def _cached_tldr(path: str) -> dict | None:
    report = load_json(Path(path))
    return report if isinstance(report, dict) and isinstance(report.get("arms"), list) else None


def tldr_note(target_speedup: float, skip_policy: bool, prompt_at_full_depth: bool = True, path: Path = TLDR_FILE) -> str:
    """Under the panes for TL;DR: the test set's figures at the nearest evaluated speedup with the prompt
    at the same depth (ROUGE-L as a share of the 1x arm's, how often a summary names the main subject),
    from the committed report; a line that says it is not evaluated where there is none."""
    report = _cached_tldr(str(path))
    if report is None:
        return "The TL;DR task is not evaluated yet (<code>python -m model eval-task tldr</code> writes its test-set figures)."
    if skip_policy != ((report.get("config") or {}).get("policy") != "none"):
        return ""  # the report ran the other state of the skip policy
    arms = [arm for arm in report["arms"] if _is_number(arm.get("speedup")) and arm["speedup"] > 1
            and arm.get("prompt_at_full_depth", True) == prompt_at_full_depth]
    full = next((arm for arm in report["arms"] if arm.get("speedup") == 1.0), {})
    if not arms:
        return ""
    arm = min(arms, key=lambda a: abs(a["speedup"] - target_speedup))
    share = (arm.get("shares") or {}).get("rougeL") or {}
    return (f"On {_text(report.get('posts_scored', '?'))} TL;DR test posts, {_text(arm.get('label', ''))} keeps "
            f"{_share(share.get('share'))} of the 1x arm's ROUGE-L (95% interval {_share(share.get('low'))}–"
            f"{_share(share.get('high'))}) and names the main subject in {_percent(arm.get('names_main_subject'))} of "
            f"its summaries (1x: {_percent(full.get('names_main_subject'))}).")
