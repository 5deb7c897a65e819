"""One-click lessons for a classroom, and settings carried in a link.

A lesson sets some controls (by settings name) and shows a question and what to look for. A
shared link carries settings in the URL query, named exactly as the public API's parameters
(e.g. ``/?target_speedup=3&decay=cosine&prompt=...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.settings import Limits, PlaygroundSettings


@dataclass(frozen=True)
class Lesson:
    title: str
    question: str
    look_for: str
    settings: dict = field(default_factory=dict)

    def markdown(self) -> str:
        return f"**{self.title}.** {self.question}  \nLook for: {self.look_for} Then press **Generate**."


# Every lesson starts from the same base, so the order in which a class clicks them does not matter.
LESSON_BASE = dict(target_speedup=2.0, decay="linear", batch_size=1, skip_policy=True, lens=False,
                   prompt_at_full_depth=True, min_layers=0, max_layers=0, decay_length=0, temperature=0.0)

LESSONS = (
    Lesson("1x is the full model", "With no skipping, does SkipDecode give exactly the full model's text?",
           "both panes identical, every heatmap column full height.", dict(target_speedup=1.0)),
    Lesson("One exit for the whole batch", "Why does SkipDecode keep batching working?",
           "with 4 rows, every column of the heatmap (and of the How it works batch view) has one depth for all "
           "rows: nobody waits for a deeper row.", dict(batch_size=4)),
    Lesson("The skip policy off at 2x", "What does fine-tuning under the skip policy buy?",
           "the text with the adapter off drifts within a few tokens; switch it back on and compare the match strip.",
           dict(skip_policy=False)),
    Lesson("Linear vs cosine at 3x", "Same speedup, different decay: which keeps closer to the full model?",
           "the schedule plot's shape, and where the match strip turns red; then try decay = linear.",
           dict(target_speedup=3.0, decay="cosine")),
    Lesson("Prompt at the budget", "What if the prompt itself runs only the first step's layers?",
           "the prompt columns of the heatmap lose their middle layers (the KV cache is still a prefix).",
           dict(prompt_at_full_depth=False)),
    Lesson("Where does the skip first diverge?", "At the first token that differs, which layers changed their mind?",
           "the red line in the heatmap; hover its cells: the logit lens shows each layer's top-5 guesses.",
           dict(lens=True)),
)


def lesson_values(lesson: Lesson) -> dict:
    return LESSON_BASE | lesson.settings


def settings_from_query(query: dict[str, str], limits: Limits, defaults: dict) -> tuple[dict, str]:
    """(values to set, message) from a URL query: known API parameter names only, each checked
    by the settings schema; a bad value is named in the message and left out."""
    names = PlaygroundSettings.api_names()
    values, problems = {}, []
    for name in names:
        if name not in query:
            continue
        try:
            checked = PlaygroundSettings.from_values(limits, **(defaults | {"prompt": "x", name: query[name]}))
            values[name] = getattr(checked, name)
        except ValueError as error:
            problems.append(str(error))
    unknown = sorted(set(query) - set(names) - {"__theme", "view"})
    if unknown:
        problems.append(f"unknown link parameter(s): {', '.join(unknown)}")
    return values, "; ".join(problems)
