"""The low-bit CPU engine: int4/int8 weights, the GGUF's own Q4_1 blocks, the native decode step
(lean_step.cpp) and the start-up cache of prepared low-bit weights."""
