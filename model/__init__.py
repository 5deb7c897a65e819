"""SkipDecode library: the method (skipdecode/), the low-bit CPU engine (lowbit/), the runtime face
(loading.py, generation/), training (training/), evaluation and benchmarks (evaluation/), the
studies (studies/) and the command line (cli.py). docs/DESIGN.md, "Layers", draws which may import
which.

Importing this package is cheap (no torch): import the module you need, e.g.
``from model.generation.generator import TextGenerator`` or ``from model.skipdecode.schedule import ScheduleConfig``.
"""
