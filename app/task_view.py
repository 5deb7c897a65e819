"""The task choice on the page: the E2E examples and MR form, the TL;DR example posts (layout), and the
events that switch the page between general chat and a task. The handlers are plain functions of the
values; which model runs and how is decided in app/handlers.py and model/tasks.
"""

from __future__ import annotations

import gradio as gr

from app.handlers import Playground
from app.page.controls import with_settings
from app.page.shown_text import as_markdown
from app.settings import EXAMPLE_PROMPTS
from app.tasks import (
    TASK_FIXED,
    TASK_LABELS,
    TLDR,
    compose,
    example_inputs,
    examples,
    fixed_controls,
    fixed_note,
    input_problem,
    is_task,
    is_valid_mr,
    is_valid_post,
    post_examples,
    task_budget,
    task_name,
)
from model.generation.generator import TextGenerator
from model.tasks.e2e import ATTRIBUTE_VALUES, ATTRIBUTES

LEAVE_OUT = ("(leave out)", "")  # a dropdown's first choice: the attribute is not in the MR
FREE_TEXT = {"name": "e.g. The Eagle", "near": "e.g. Burger King (optional)"}


def mr_form(prompt: gr.Textbox) -> dict:
    """Test-set MRs as examples and a form of the 8 attributes that writes an MR into ``prompt``;
    hidden until a task is chosen. Returns its components by name."""
    ui: dict = {}
    with gr.Column(visible=False, elem_id="e2e-box") as ui["e2e_box"]:
        if examples():
            gr.Examples([[mr] for mr in examples()], inputs=[prompt],
                        label="Example MRs (the E2E test set): a click puts one in the prompt box, Generate runs it",
                        cache_examples=False, examples_per_page=8)
        with gr.Accordion("Compose an MR from the 8 attributes", open=False, elem_id="mr-form"):
            fields = {}
            for first, second in zip(ATTRIBUTES[::2], ATTRIBUTES[1::2]):  # two per row; a phone wraps them
                with gr.Row():
                    for key in (first, second):
                        fields[key] = _field(key)
            ui["mr_fields"] = fields
            ui["mr_compose"] = gr.Button("Put this MR in the prompt box", size="sm", elem_id="mr-compose")
            ui["mr_note"] = gr.Markdown(elem_id="mr-note", latex_delimiters=[])
    return ui


POST_LABEL = "Post: its title on the first line, then the post (as on Reddit)"
POST_PLACEHOLDER = ("My roommate keeps eating my food\n\nWe have shared a flat for a year and ... (the first line is "
                    "the title, everything under it the post)")
TLDR_NOTE = ("The TL;DR task model is **the default model prompted for a TL;DR** (the paper fine-tuned one): its "
             "prompt is the title, the post and the request \"TL;DR of the post above in one sentence:\"; a summary "
             "ends at its first line break. The line under the panes says whether each names the post's main subject.")
EXAMPLE_LABEL_CHARS = 58  # gradio cuts a longer example label mid-word


def post_box(prompt: gr.Textbox) -> dict:
    """Test-set posts as examples (labelled by their titles) and what the task model is; hidden until
    TL;DR is chosen. Returns its components by name."""
    ui: dict = {}
    with gr.Column(visible=False, elem_id="tldr-box") as ui["tldr_box"]:
        gr.Markdown(TLDR_NOTE, elem_id="tldr-note")
        if post_examples():
            gr.Examples([[text] for text in example_inputs(TLDR)], inputs=[prompt],
                        example_labels=[_label(post.title) for post in post_examples()],
                        label="Example posts (the TL;DR test set): a click puts one in the post box, Generate runs it",
                        cache_examples=False, examples_per_page=8, elem_id="tldr-examples")
    return ui


def _label(title: str) -> str:
    """An example post's label: its title, cut at a word within EXAMPLE_LABEL_CHARS."""
    if len(title) <= EXAMPLE_LABEL_CHARS:
        return title
    return title[:EXAMPLE_LABEL_CHARS].rsplit(" ", 1)[0].rstrip(" ,.;:") + "…"


def _field(key: str) -> gr.components.Component:
    elem_id = f"mr-{key.replace(' ', '-').lower()}"
    if key in ATTRIBUTE_VALUES:  # closed attributes: the values the challenge's data uses
        return gr.Dropdown([LEAVE_OUT, *((v, v) for v in ATTRIBUTE_VALUES[key])], value="", label=key,
                           elem_id=elem_id, min_width=150)
    return gr.Textbox(label=key, placeholder=FREE_TEXT.get(key, ""), max_length=60, elem_id=elem_id, min_width=150)


TITLE = "## SkipDecode Playground\nLayer skipping that keeps batching and the KV cache (arXiv 2307.02628)"


def header_markdown(generator: TextGenerator, task: str = "chat", task_model: TextGenerator | None = None) -> str:
    """The page's header: the title, then which model the panes run for the task chosen. A task's
    model (``task_model``, once loaded; before, the general model with the task's LoRA merged, its
    weights not named: they are chosen as it loads) is the full model of both panes; in chat the
    general model and its skip policy."""
    task = task if task in TASK_LABELS else "chat"  # a value the radio does not offer names nothing
    model = task_model if is_task(task) and task_model is not None else generator
    # TL;DR's model is the general one (with a TL;DR policy where one is shipped): its own name
    loaded, named = model.loaded, model is task_model or not is_task(task) or task == TLDR
    name = loaded.name if named else f"{loaded.name}+{task}"
    weights = f", {loaded.quantize} weights" if loaded.quantize != "none" and named else ""
    facts = f"{TITLE} · **{name}**, {model.num_layers} layers, {loaded.device}{weights} · "
    if task == TLDR:
        return facts + ("the TL;DR task: the default model prompted for a TL;DR (the paper fine-tuned one) in both "
                        "panes: SkipDecode runs it with the TL;DR skip policy for the chosen speedup where one is "
                        "shipped, else the general skip policy; the full model at every layer.")
    if is_task(task):
        return facts + (f"the {task_name(task)} task model (the general model fine-tuned on the task) in both panes: "
                        "SkipDecode runs it with the task's skip policy for the chosen speedup, the full model "
                        "at every layer.")
    return facts + ("SkipDecode with the skip-policy adapter, the full model original." if loaded.adapter_path
                    else "no skip-policy adapter loaded: skipping will hurt quality.")


def header_for(playground: Playground, task: str) -> str:
    """The header for the task chosen, with the task's model facts once it has loaded."""
    task_model = playground.tasks.any(task) if task in TASK_LABELS and is_task(task) else None  # TL;DR: a policy's
    return header_markdown(playground.get_generator(), task, task_model)


def full_title(task: str) -> str:
    """The full pane's title: the original model in chat, the task model for a task."""
    if task == TLDR:
        return "**Full model** (the default model prompted for a TL;DR, every layer)"
    return (f"**Full model** (the {task_name(task)} task model, every layer)" if is_task(task)
            else "**Full model** (the original, every layer)")


PROMPT_BOXES = {  # the prompt box per task: label, lines shown, placeholder
    "chat": dict(label="Prompt", lines=2, max_lines=12, placeholder=None),
    "e2e": dict(label="Prompt: a meaning representation (MR), as in the E2E data", lines=2, max_lines=12, placeholder=None),
    TLDR: dict(label=POST_LABEL, lines=4, max_lines=8, placeholder=POST_PLACEHOLDER),  # Generate stays near
}


def task_view(task: str) -> list:
    """What a task choice shows: the controls it fixes (hidden; TASK_FIXED's order), its one-line note,
    the E2E examples and form, the TL;DR examples, the chat examples, the full pane's title and the
    prompt box (its label and size)."""
    on, fixed = is_task(task), fixed_controls(task)
    return [gr.update(visible=name not in fixed) for name in TASK_FIXED] + [
        gr.update(visible=on, value=fixed_note(task)), gr.update(visible=task == "e2e"),
        gr.update(visible=task == TLDR), gr.update(visible=not on), gr.update(value=full_title(task)),
        gr.update(**PROMPT_BOXES.get(task, PROMPT_BOXES["chat"]))]


def fits_task(task: str, prompt: str) -> bool:
    """Whether ``prompt`` may stay in the box when the visitor switches to ``task`` (else an example
    replaces it): the task's own input (without the task's data there is nothing to replace it with);
    in chat anything but another task's input (an MR, an example post)."""
    if task == TLDR:
        return is_valid_post(prompt) or not post_examples()
    if is_task(task):
        return is_valid_mr(prompt) or not examples()
    return not is_valid_mr(prompt) and prompt not in example_inputs(TLDR)


def switch_values(task: str, prompt: str, max_new_tokens: int | None = None) -> tuple:
    """A visitor switching the task: a prompt of the right kind (an example MR or post for a task, the
    first example prompt back in chat; a prompt that fits is kept) and the task's output budget,
    within the deployer's ``max_new_tokens`` (a budget over it would refuse every later event)."""
    budget = task_budget(task)
    shown = gr.skip() if fits_task(task, prompt) else (example_inputs(task)[0] if is_task(task) else EXAMPLE_PROMPTS[0])
    return shown, budget if max_new_tokens is None else min(budget, max_new_tokens)


def input_feedback(task: str, prompt: str):
    """Under the prompt box, as the visitor types: what is wrong with it as the task's input (an MR:
    parse_mr's words; a post: parse_post's), shown as text, or nothing. (A Generate with a bad input is
    refused before it queues, and gradio shows such a refusal nowhere on the page: this line is where
    the visitor reads why.)"""
    problem = input_problem(task, prompt) if isinstance(prompt, str) else None
    if problem is None:
        return gr.update(visible=False, value="")
    kind, _, reason = problem.partition(": ")
    return gr.update(visible=True, value=f"**{kind}:** {as_markdown(reason)}")


def compose_into_prompt(*values: str) -> tuple:
    """The form's fields (ATTRIBUTES order) -> (the MR for the prompt box, ""), or the problem."""
    mr, problem = compose(dict(zip(ATTRIBUTES, values)))
    return (mr if mr is not None else gr.skip()), as_markdown(problem) if problem else ""


def task_events(demo: gr.Blocks, playground: Playground, ui: dict, fixed: list, settings: set, lane: dict) -> None:
    """Wire the task radio and the MR form. .change (a visitor, a lesson or a link) sets what is
    shown; .input (a visitor only) also sets the prompt and the budget, then loads the task's
    model in the model lane so the first Generate does not wait for it."""
    c = ui["c"]
    private = dict(api_visibility="private")
    c["task"].change(lambda task: task_view(task) + [header_for(playground, task)], [c["task"]],
                     [*fixed, ui["task_note"], ui["e2e_box"], ui["tldr_box"], ui["chat_examples"], ui["full_title"],
                      c["prompt"], ui["header"]],
                     queue=False,
                     api_name="ui_task_view", **private)
    preview = dict(fn=with_settings(playground.schedule_preview, c), inputs=settings,
                   outputs=[ui["schedule_plot"], ui["schedule_note"]], queue=False, api_name=False)
    limit = playground.limits.max_new_tokens
    c["task"].input(lambda task, prompt: switch_values(task, prompt, limit), [c["task"], c["prompt"]],
                    [c["prompt"], c["max_new_tokens"]], queue=False,
                    api_name="ui_task_switch", **private).then(
        with_settings(playground.load_task, c), settings, [ui["status"]], api_name="ui_task_load", **private,
        **lane).then(**preview).then(lambda task: header_for(playground, task), [c["task"]], [ui["header"]],
                                     queue=False, api_name=False)  # the loaded task model's own facts
    gr.on([c["prompt"].change, c["task"].change], input_feedback, [c["task"], c["prompt"]], [ui["mr_problem"]],
          queue=False, show_progress="hidden", trigger_mode="always_last", api_name="ui_mr_feedback", **private)
    ui["mr_compose"].click(compose_into_prompt, list(ui["mr_fields"].values()), [c["prompt"], ui["mr_note"]],
                           queue=False, api_name="ui_compose_mr", **private)
