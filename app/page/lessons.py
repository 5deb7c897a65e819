"""One-click lessons for a classroom.

A lesson sets the controls (by settings name), generates, and says what to look for; most have a
second run ("then") that changes one thing, so the class compares two runs of the same prompt.
Every lesson starts from the same base, so the order in which a class clicks them does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from app.page.results import e2e_note
from app.settings import EXAMPLE_PROMPTS
from app.tasks import TLDR, post_examples
from model.tasks import tldr
from model.tasks.task_models import check_task


@dataclass(frozen=True)
class Lesson:
    """A lesson: its title, the question, what to look for (two lines at most: a class reads it in
    seconds) and the rest behind a "more" fold."""

    title: str
    question: str
    look_for: str
    settings: dict = field(default_factory=dict)
    then_label: str = ""  # the second run's button text ("" = none)
    then: dict = field(default_factory=dict)  # what the second run changes
    more: str = ""  # the detail and the evidence, folded

    def markdown(self) -> str:
        then = f" Then press **{self.then_label}** and compare." if self.then_label else ""
        more = f"\n\n<details><summary>more</summary>\n\n{self.more}\n\n</details>" if self.more else ""
        return f"#### {self.title}\n{self.question}  \n**Look for:** {self.look_for}{then}{more}"


# The base every lesson starts from. warmup and order come from the loaded skip policy
# (lesson_values), the prompt is the page's default unless a lesson needs another.
LESSON_BASE = dict(task="chat", prompt=EXAMPLE_PROMPTS[0], target_speedup=2.0, decay="linear", batch_size=1, skip_policy=True,
                   lens=False, lens_kl=False, prompt_at_full_depth=True, min_layers=0, max_layers=0, decay_length=0,
                   temperature=0.0, max_new_tokens=48)
# Prompts picked by running 14 prompts (greedy, 48 tokens, int8 weights, this repo's CPU): with the
# skip policy off at 2x the exercise answer drifts and stops mid-sentence, and the full model picks
# SkipDecode's next token at 35% of its positions against 65% with the policy on; at 3x cosine
# answers the Romeo and Juliet question ("attributed to William Shakespeare.", 58%) where linear
# wanders off (31%). One prompt is one sample: on most example prompts this share does not
# separate the policy's states, which is why the lesson points at the held-out figures too.
TRAINED = "the loaded skip policy's placement"  # a then-value: back to the trained warmup/order
EXERCISE = "What are the benefits of exercise?"
ROMEO = "Who wrote Romeo and Juliet?"
# A test-set MR of six facts (assets/data/e2e/testset_w_refs.csv) where 3x writes the task model's
# very description, every fact in it: checked at batch 1 on this CPU's default weights, as the lesson runs it.
E2E_MR = "name[Giraffe], eatType[pub], food[French], area[riverside], familyFriendly[yes], near[Raja Indian Cuisine]"
# A test-set MR of seven facts where 3x, at its floor of 7 layers, says "It is not kid friendly." twice
# and leaves the price out, which the task model states: checked the same way. Over the test set
# (float32) the task model mentions every fact of the MR in 95% of its descriptions, 3x in 72%:
# dropping a last fact is now what 3x loses most often.
E2E_DROPPED_FACT_MR = ("name[The Mill], eatType[pub], food[English], priceRange[moderate], area[city centre], "
                       "familyFriendly[no], near[Raja Indian Cuisine]")

# A test-set post (one of the page's TL;DR examples: a clear subject, brother, mum and the chocolate milk)
# whose prompt is a few hundred tokens, as the task's are; the page counts them and times both prefills.
TLDR_POST = next((tldr.post_text(post) for post in post_examples() if post.post_id == "t3_34p07j"), "")

LOOK_FOR_CHARS = 170  # about two lines of the lessons' column at 1440 px (tests/app/page/test_lessons.py)

E2E_TEST_SET = e2e_note(3.0, skip_policy=True)  # the test set, facts first, beside BLEU and ROUGE-L

LESSONS = (
    Lesson("1x is the full model", "With no skipping, does SkipDecode give exactly the full model's text?",
           "both panes identical, every heatmap column full height, every square of the match strip blue.",
           dict(target_speedup=1.0)),
    Lesson("One exit for the whole batch", "Why does SkipDecode keep batching working?",
           "four rows per pane; at every position all four SkipDecode rows share one colour (one layer count).",
           dict(batch_size=4), more="The same number of layers for every row at a position means nobody waits "
           "for a deeper row: the batch stays one matrix product per layer, and every row's KV cache stays a prefix."),
    Lesson("The skip policy off at 2x", "What does fine-tuning under the skip policy buy?",
           "the text drifting and stopping mid-sentence, and the share under the panes (how often the full model "
           "would pick SkipDecode's next token).",
           dict(skip_policy=False, prompt=EXERCISE), "Run it with the skip policy on", dict(skip_policy=True),
           more="One prompt is one sample: the held-out prompts are the evidence (perplexity ratio, agreement with "
           "and without the policy), quoted under the panes and in the Results tab."),
    Lesson("Linear vs cosine at 3x", "Same speedup, different decay: which keeps closer to the full model?",
           "whether each pane names Shakespeare (the line under the panes says), and the schedule plot's shape.",
           dict(target_speedup=3.0, decay="cosine", prompt=ROMEO), "Run it with linear decay", dict(decay="linear"),
           more="Cosine stays deep longer, then falls faster. Also compare the red line on the heatmap (the first "
           "token the full model would have written differently) and the share under the panes."),
    Lesson("Prompt at the budget", "What if the prompt itself runs only the first step's layers?",
           "the prompt columns of the heatmap lose some layers (the KV cache is still a prefix).",
           dict(prompt_at_full_depth=False), "Run it with the prompt at full depth", dict(prompt_at_full_depth=True)),
    Lesson("Where does the skip first diverge?", "At the first token the full model would write differently, "
           "which layers changed their mind?",
           "the red line in the heatmap; hover its cells: the logit lens shows each layer's top-5 guesses.",
           dict(lens=True)),
    Lesson("The paper's layer order", "The paper bypasses one block of lower/middle layers; this skip policy was "
           "trained to keep the most important layers instead. What changes?",
           "the bypassed cells form one block under the top layers, and the text usually gets worse.",
           dict(order="warmup_top", warmup=1), "Run it with the trained placement", dict(order=TRAINED, warmup=TRAINED),
           more="The skip policy learned the ranked placement (the layers a measurement found most important "
           "first), so the paper's block order runs it on layers it was not trained to stand in for."),
    Lesson("The paper's task: 3x, the same description", "A model fine-tuned for one task (E2E: a restaurant's "
           "facts in, a description out) runs a third of its layers. Does the description survive?",
           "the same description, every fact marked stated (blue) in both panes; the line under the panes counts "
           "stated, WRONG and made-up facts.",
           dict(task="e2e", target_speedup=3.0, prompt=E2E_MR, max_new_tokens=check_task("e2e").max_new_tokens),
           "Run an MR where 3x drops a fact", dict(prompt=E2E_DROPPED_FACT_MR),
           more="This MR comes out word for word at 3x, but not every MR does. " + E2E_TEST_SET + " "
           "The second run gives an MR of seven facts where SkipDecode says \"It is not kid friendly.\" twice and "
           "leaves the price out, which the task model states: at the end of a long description a 3x schedule runs "
           "7 of the 30 layers, and a dropped last fact is what 3x loses most often. At 5x wrong facts appear: "
           "paste name[The Golden Palace], eatType[coffee shop], food[Italian], priceRange[cheap], area[riverside], "
           "familyFriendly[yes], near[Café Rouge] and press 5x: SkipDecode writes \"It is located in the city centre.\", marked in red. Change "
           "near[...] to a place of your own: the note above the SkipDecode pane says which place the training data "
           "knows both models were given in its place (the E2E challenge baseline's delexicalisation); without "
           "that swap SkipDecode garbles a new place (near[The Painted Lighthouse] came out \"near The "
           "Paintened\"). The Results tab gives the whole test set."),
    Lesson("The class as one batch", "The whole class presses Generate at the same moment: how does one model "
           "answer everyone at once?",
           "the line under the panes: \"One batch of N visitors\": every row ran the heatmap's layers, one exit "
           "depth per position for the whole batch.",
           dict(task="e2e", target_speedup=3.0, prompt=E2E_MR, max_new_tokens=check_task("e2e").max_new_tokens),
           more="Open the lesson's link on the projector (the button under the lesson makes it and its QR code): "
           "it opens this lesson on every pupil's page and runs it at once. Jobs that arrive together and share "
           "a schedule (the same task, speedup and settings; each pupil may change the MR) run as ONE batch: one "
           "matrix product per layer for all of them, and each page shows only its own row. Per-token early exit "
           "cannot do this: its rows would want different depths at the same position, and a skipped layer "
           "leaves a hole in the KV cache. SkipDecode gives the whole batch one depth per position, falling as "
           "it goes, so every layer's cache stays a prefix. Step mode and the logit lens run alone."),
    # Last: a lesson's link names it by its place in the list (?lesson=N), so a new lesson goes at the end.
    Lesson("A long prompt: the TL;DR task at 3x", "A Reddit post in, a one-sentence TL;DR out, at 3x: is the "
           "whole request 3x faster?",
           "the line under the panes: the prompt's tokens, each model's time to the first token, the whole request's "
           "speed beside the decode steps'.",
           dict(task=TLDR, target_speedup=3.0, prompt=TLDR_POST, max_new_tokens=tldr.MAX_NEW_TOKENS),
           "Run it with the prompt at the first budget", dict(prompt_at_full_depth=False),
           more="SkipDecode skips layers in the decode steps only: the prompt, the post's few hundred tokens (the line "
           "under the panes counts them), is prefilled at full depth, as the paper does, so SkipDecode's time to the "
           "first token is the full model's. A TL;DR is one short sentence after a long prompt, so that prefill is a "
           "large part of the request, and the whole request's speedup falls below the decode steps' one. The second "
           "run reads the prompt through the schedule's first budget instead (Advanced: Prompt at full depth, off; "
           "the paper leaves it open): compare the time to the first token, and the summary, and whether it still "
           "names the post's main subject. The TL;DR task model here is the default model prompted for a TL;DR (the "
           "paper fine-tuned one), and SkipDecode runs the general skip policy until a TL;DR policy is shipped (the "
           "status line names the one it runs)."),
)


# The page a bare visit lands on (no link query): this lesson's first run, set and ready for Generate.
# Why this one (docs/SERVING.md, "The first run", has the runs): general chat at 2x drifts from the full
# model within a sentence, while on this MR the paper's task at 3x writes the task model's description
# word for word, every fact stated; the lesson's second run, one click away, shows a fact that 3x drops.
LANDING_LESSON = "The paper's task: 3x, the same description"
LANDING_LINE = ("**You are looking at** the paper's task (E2E: a restaurant's facts in, a description out) at 3x: "
                "SkipDecode runs a third of the task model's layers. Press **Generate**: on this MR it writes the "
                "task model's description word for word. Then "
                f"**{next(lesson for lesson in LESSONS if lesson.title == LANDING_LESSON).then_label}** shows where "
                "it breaks (the price left out). General chat is under *Task*.")
# The line when the page lands on general chat (another model than the tasks' base, or no task models).
CHAT_LANDING_LINE = ("**You are looking at** general chat at 2x: one general skip policy on a 135M model, where "
                     "SkipDecode is weakest (its answer drifts from the full model's within a sentence or two). For "
                     "the method at its best, run the lesson *The paper's task: 3x*: the task model's description word "
                     "for word at a third of the layers; then its second run shows a fact 3x drops.")


def landing_values(defaults: dict) -> dict:
    """The controls a bare visit sets: the landing lesson's first run (``defaults``: as lesson_values)."""
    return lesson_values(lesson_by_title(LANDING_LESSON), defaults)


def lesson_values(lesson: Lesson, defaults: dict, then: bool = False) -> dict:
    """Every control a lesson touches: the base, the loaded skip policy's placement (``defaults``:
    warmup and order), the lesson's own settings and, for its second run, ``then``."""
    placement = {"warmup": defaults["warmup"], "order": defaults["order"]}
    values = LESSON_BASE | placement | lesson.settings | (lesson.then if then else {})
    return {name: placement[name] if value == TRAINED else value for name, value in values.items()}


def lesson_names() -> tuple[str, ...]:
    """The controls any lesson sets (the same for every lesson)."""
    return (*LESSON_BASE, "warmup", "order")


def lesson_by_title(title: str) -> Lesson:
    """The lesson of that title (the first one for an unknown title)."""
    return next((lesson for lesson in LESSONS if lesson.title == title), LESSONS[0])


def lesson_text(title: str) -> tuple:
    """What the page shows for a picked lesson: its text, and its second-run button (if any)."""
    lesson = lesson_by_title(title)
    return lesson.markdown(), gr.Button(lesson.then_label or "Then", visible=bool(lesson.then_label))


def lesson_settings(title: str, defaults: dict, then: bool) -> list:
    """The values of lesson_names() for a lesson's run (or its second run)."""
    values = lesson_values(lesson_by_title(title), defaults, then)
    return [values[name] for name in lesson_names()]
