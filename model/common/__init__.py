"""The library's leaves: the environment settings (settings.py), the cache folder, progress lines on
stderr, the machine's CPU facts.

Imports nothing else of the project (the bottom layer; docs/DESIGN.md, "Layers")."""
