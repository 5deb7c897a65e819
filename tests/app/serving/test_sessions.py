"""Step sessions (app/serving/sessions.py): bounded in count, idle time, KV positions, bytes and per
address, an evicted session's stream closed; and the server's cap on malloc arenas."""

import pytest


def test_step_sessions_are_bounded_and_expire():
    import time

    from app.serving.sessions import StepSessions

    sessions = StepSessions(max_sessions=3, idle_s=0.2)
    for i in range(5):
        sessions.put(f"s{i}", ("state", i))
    assert len(sessions) == 3 and sessions.get("s0") is None and sessions.get("s4") == ("state", 4)
    time.sleep(0.3)
    assert len(sessions) == 0


def test_step_sessions_are_bounded_in_kv_positions_and_freed_on_eviction():
    from app.serving.sessions import StepSessions

    closed = []

    def iterator(name):
        try:
            yield name
        finally:
            closed.append(name)

    sessions = StepSessions(max_sessions=10, max_positions=100)
    for name in ("a", "b", "c"):
        it = iterator(name)
        next(it)
        sessions.put(name, ("settings", it, "renderer"), positions=40)
    assert sessions.positions() <= 100 and sessions.get("a") is None and closed == ["a"]
    with pytest.raises(ValueError, match="the limit is 100"):
        sessions.put("huge", ("settings", iter(()), "renderer"), positions=101)
    sessions.pop("b")
    assert closed == ["a", "b"]


def test_step_sessions_are_bounded_per_address_and_in_bytes():
    """A script's step sessions evict its own oldest ones, never a visitor's; memory is bounded in
    bytes (a lens session's hidden states count, not only its KV positions)."""
    from types import SimpleNamespace

    from app.serving.job_cost import kv_bytes_per_position, session_bytes
    from app.serving.sessions import StepSessions

    sessions = StepSessions(max_sessions=16, max_positions=10**6, max_bytes=1000, per_owner=4)
    sessions.put("visitor", ("settings", iter(()), "renderer"), positions=10, owner="10.0.0.2", nbytes=100)
    for i in range(16):  # one script's 16 sessions from one address
        sessions.put(f"script{i}", ("settings", iter(()), "renderer"), positions=10, owner="10.0.0.1", nbytes=50)
    assert sessions.get("visitor") is not None and len(sessions) == 5  # the visitor and the script's last 4
    assert sessions.get("script15") is not None and sessions.get("script0") is None
    sessions.put("big", ("settings", iter(()), "renderer"), positions=10, owner="10.0.0.3", nbytes=800)
    assert sessions.nbytes() <= 1000 and sessions.get("big") is not None  # the least recently used made room
    with pytest.raises(ValueError, match="the limit is 0 MB"):
        sessions.put("huge", ("settings", iter(()), "renderer"), owner="10.0.0.4", nbytes=1001)
    smollm = SimpleNamespace(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
    assert kv_bytes_per_position(smollm) == 2 * 30 * 3 * 64 * 4
    # the 700-token session with the lens: tens of MB of KV plus the lens's hidden states
    assert 50 * 2**20 < session_bytes(smollm, 2 * 700, 256, True) < 200 * 2**20


def test_the_server_caps_malloc_arenas_at_start(environment_settings):
    import platform

    from app.serving.sessions import limit_malloc_arenas

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert limit_malloc_arenas(4) is True  # app.py's: the setting passed down
    assert environment_settings(MALLOC_ARENA_MAX="").malloc_arena_max == 2  # the default cap
    assert limit_malloc_arenas() is True  # None: the setting's
    with pytest.raises(ValueError, match="MALLOC_ARENA_MAX must be a number; got 'not a number'"):
        environment_settings(MALLOC_ARENA_MAX="not a number")  # refused, named (it used to fall back)
