"""Text in, text out (the runtime's face, docs/DESIGN.md "Layers"): ``TextGenerator`` (generator.py)
orchestrates a run over the parts each found by its name — the chat template and encoding (text.py),
the schedules and their cache (schedules.py), the logit lens (lens.py), the full model's judgement
(judge.py) — and a run's request, prepared form and result (runs.py). Import from the module that
defines a name, e.g. ``from model.generation.generator import TextGenerator``."""
