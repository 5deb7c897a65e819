"""What the page shows: the race rendered as HTML and figures, the lessons, the Results tab,
share links, the controls built from the settings schema, styling. Imports no serving code
(tests/project/test_layers.py)."""
