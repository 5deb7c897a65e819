"""A few loaded generators kept by key, each loaded once: the task models and their policies
(app/tasks.py). A load takes seconds, so it runs outside the items' lock (the loaded ones keep
serving meanwhile) and one at a time (two first visitors of a policy load it once)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

from model.generation.generator import TextGenerator


class LoadedGenerators:
    """At most ``size`` generators by key, the least recently used dropped first (``get`` counts as a use)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._items: OrderedDict[Hashable, TextGenerator] = OrderedDict()
        self._lock = threading.Lock()  # the items
        self._loading = threading.Lock()  # one load at a time

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, key: Hashable) -> TextGenerator | None:
        with self._lock:
            generator = self._items.get(key)
            if generator is not None:
                self._items.move_to_end(key)
            return generator

    def get_or_load(self, key: Hashable, load: Callable[[], TextGenerator]) -> TextGenerator:
        """The generator under ``key``, made by ``load`` when there is none; what ``load`` raises reaches the
        caller and nothing is kept."""
        found = self.get(key)
        if found is not None:
            return found
        with self._loading:
            found = self.get(key)  # loaded by a request this one waited behind
            if found is not None:
                return found
            generator = load()
            with self._lock:
                self._items[key] = generator
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return generator

    def newest(self, wanted: Callable[[Hashable], bool]) -> tuple[Hashable, TextGenerator] | None:
        """The most recently used (key, generator) whose key ``wanted`` accepts, without counting it as a use."""
        with self._lock:
            return next(((key, g) for key, g in reversed(self._items.items()) if wanted(key)), None)
