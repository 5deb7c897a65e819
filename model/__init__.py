"""SkipDecode library: schedule, decoder, model access, training, evaluation, benchmark, CLI.

Importing this package is cheap (no torch): submodules are imported where they are used.
"""
