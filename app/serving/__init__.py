"""What keeps the server fair and safe: admission and the fair queue, the request guard, sessions
and page tokens, slow clients, security headers, the job cost, the GPU wrapper, the stream's frames and
every use of gradio's internals. Imports no page code (tests/project/test_layers.py)."""
