"""The app through a real launched Gradio server and gradio_client."""

import pytest
from gradio_client import Client

from app.ui import build_demo
from model.generation import TextGenerator


@pytest.fixture(scope="module")
def client(default_model):
    generator = TextGenerator(default_model)
    demo = build_demo(lambda: generator)
    demo.queue()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    yield Client(demo.local_url, verbose=False)
    demo.close()


def test_generate_endpoint_returns_both_outputs(client):
    skip, full, summary = client.predict("Name three colours.", 2.0, "linear", 12, api_name="/generate")
    assert skip and full
    assert "measured speedup" in summary and "layer speedup" in summary


def test_bad_input_is_a_clear_error_and_server_keeps_serving(client):
    with pytest.raises(Exception, match="empty"):
        client.predict("   ", 2.0, "linear", 12, api_name="/generate")
    with pytest.raises(Exception, match="maximum"):
        client.predict("hi", 40.0, "linear", 12, api_name="/generate")
    skip, full, _ = client.predict("Say hi.", 1.5, "cosine", 8, api_name="/generate")
    assert full
