"""The low-bit CPU engine: int4/int8 weights (quantization), the GGUF's own Q4_1 blocks
(gguf_weights), the native decode step (native_step over native_kernels' lean_step.cpp) and the
start-up cache of prepared low-bit weights (weight_cache).

Importing the engine plugs its parts into the method's lean layer (the one arrow that would
otherwise point up; docs/DESIGN.md, "Layers"): every low-bit module is made here, so wherever
one exists the lean layer fuses, stacks and runs it natively, whichever module was imported first.
"""

from model.lowbit.native_step import NativeDecode, native_argmax, run_native_layers
from model.lowbit.quantization import LOW_BIT_PROJECTIONS, fuse_low_bit, lean_lora
from model.skipdecode.lean_layer import LowBitParts, use_low_bit

use_low_bit(LowBitParts(fuse=fuse_low_bit, lean_lora=lean_lora, native=NativeDecode.of, projections=LOW_BIT_PROJECTIONS,
                        native_run=run_native_layers, argmax=native_argmax))
