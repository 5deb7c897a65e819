"""The playground UI. Importing this module loads no model: app.py hands in a generator factory."""

from __future__ import annotations

from typing import Callable, Iterator

import gradio as gr

from model.decoder import SamplingConfig
from model.generation import GenerationRequest, ScheduleRequest, TextGenerator
from model.schedule import DECAY_FUNCTIONS

EXAMPLE_PROMPTS = [
    "Name three colours.",
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about autumn.",
    "Give me three tips for learning to cook.",
]


def stream_comparison(
    generator: TextGenerator, prompt: str, speedup: float, decay: str, max_new_tokens: int
) -> Iterator[tuple[str, str, str]]:
    """Yield (skipdecode text, full-model text, summary) while both run, SkipDecode first."""
    settings = dict(prompts=(prompt,), max_new_tokens=int(max_new_tokens), sampling=SamplingConfig())
    skip_request = GenerationRequest(schedule=ScheduleRequest(target_speedup=float(speedup), decay=decay), **settings)
    full_request = GenerationRequest(schedule=ScheduleRequest(full=True), **settings)
    generator.schedule_for(skip_request.schedule, skip_request.max_new_tokens)  # bad settings fail before work
    texts = {"skip": "", "full": ""}
    results = {}
    for key, request in (("skip", skip_request), ("full", full_request)):
        events = generator.stream(request)
        tokens: list[int] = []
        while True:
            try:
                event = next(events)
            except StopIteration as stop:
                results[key] = stop.value
                texts[key] = stop.value.outputs[0]
                break
            if not event.finished[0] or event.token_ids[0] not in generator.loaded.eos_token_ids:
                tokens.append(event.token_ids[0])
            texts[key] = generator.decode_text(tokens)
            yield texts["skip"], texts["full"], "generating…"
    yield texts["skip"], texts["full"], summarize(results["skip"], results["full"])


def summarize(skip, full) -> str:
    measured = skip.decode.tokens_per_second / full.decode.tokens_per_second if full.decode.tokens_per_second else 0
    return (
        f"**SkipDecode** {skip.decode.tokens_per_second:.1f} tok/s · **full** {full.decode.tokens_per_second:.1f} tok/s · "
        f"measured speedup **{measured:.2f}x** · layer speedup {skip.decode.layer_speedup:.2f}x · "
        f"cost-model {skip.cost_speedup:.2f}x · layers per step {skip.layers_per_step[:1]}→{skip.layers_per_step[-1:]}"
    )


def build_demo(get_generator: Callable[[], TextGenerator]) -> gr.Blocks:
    def on_generate(prompt: str, speedup: float, decay: str, max_new_tokens: int):
        try:
            yield from stream_comparison(get_generator(), prompt, speedup, decay, max_new_tokens)
        except ValueError as error:
            raise gr.Error(str(error)) from None

    with gr.Blocks(title="SkipDecode Playground") as demo:
        gr.Markdown("# SkipDecode Playground\nLayer-skipping decoding with batching and KV cache (arXiv 2307.02628).")
        prompt = gr.Textbox(label="Prompt", value=EXAMPLE_PROMPTS[0], lines=2)
        gr.Examples(EXAMPLE_PROMPTS, inputs=prompt)
        with gr.Row():
            speedup = gr.Slider(1.0, 8.0, value=2.0, step=0.25, label="Target layer speedup")
            decay = gr.Dropdown(list(DECAY_FUNCTIONS), value="linear", label="Decay function")
            max_new_tokens = gr.Slider(4, 256, value=48, step=4, label="Max new tokens")
        run = gr.Button("Generate", variant="primary")
        with gr.Row():
            skip_out = gr.Textbox(label="SkipDecode", lines=8)
            full_out = gr.Textbox(label="Full model", lines=8)
        summary = gr.Markdown()
        run.click(on_generate, [prompt, speedup, decay, max_new_tokens], [skip_out, full_out, summary],
                  api_name="generate", concurrency_limit=1)
    return demo
