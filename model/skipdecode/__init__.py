"""The method: the schedule (which layers run at each step), the decoder that runs it with a
per-layer KV cache, the skip policy's learned parts, and the per-family architecture adapters.

Imports only model.common and itself: the low-bit engine plugs its lean-layer parts in through a
hook (lean_layer.use_low_bit), so this package never imports it (docs/DESIGN.md, "Layers")."""
