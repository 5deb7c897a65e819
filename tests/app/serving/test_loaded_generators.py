"""The loaded generators' cache the task models and their policies share
(app/serving/loaded_generators.py): least recently used out, one load at a time, failures not kept."""

import threading
import time

import pytest

from app.serving.loaded_generators import LoadedGenerators


def test_the_least_recently_used_goes_first_and_a_get_counts_as_a_use():
    cache = LoadedGenerators(2)
    a = cache.get_or_load("a", lambda: "generator a")
    cache.get_or_load("b", lambda: "generator b")
    assert cache.get("a") == a  # a is now the most recent
    cache.get_or_load("c", lambda: "generator c")
    assert len(cache) == 2 and cache.get("b") is None and cache.get("a") == a
    assert cache.newest(lambda key: key in ("a", "c")) == ("a", a)  # the newest accepted, not counted as a use
    assert cache.newest(lambda key: key == "z") is None


def test_two_first_visitors_load_a_generator_once():
    cache, loads, started = LoadedGenerators(2), [], threading.Event()

    def slow_load():
        loads.append(1)
        started.set()
        time.sleep(0.2)
        return "generator"

    results = []
    first = threading.Thread(target=lambda: results.append(cache.get_or_load("k", slow_load)))
    first.start()
    started.wait(5)
    second = threading.Thread(target=lambda: results.append(cache.get_or_load("k", slow_load)))
    second.start()
    first.join(5)
    second.join(5)
    assert results == ["generator", "generator"] and len(loads) == 1


def test_a_load_that_fails_reaches_the_caller_and_nothing_is_kept():
    cache = LoadedGenerators(1)

    def broken():
        raise ValueError("no such policy")

    with pytest.raises(ValueError, match="no such policy"):
        cache.get_or_load("k", broken)
    assert cache.get("k") is None and len(cache) == 0
    assert cache.get_or_load("k", lambda: "generator") == "generator"
