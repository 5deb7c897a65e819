"""Measuring: quality (evaluation, paired comparisons), low-bit agreement, speed (bench) and the
Plotly figures of all of them (reporting)."""
