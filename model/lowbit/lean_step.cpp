// The lean Llama-family layer's decode step (model/skipdecode/lean_layer.py, LeanLlamaLayer._decode_one)
// as one C++ call, for low-bit projections on a CPU.
//
// Why: a small model's decode step on a CPU is a few hundred small ops, and at one thread the
// Python interpreter's cost per op call (argument parsing, the Python-side dispatch) is a large
// share of each layer. Two forms: with int4 weights on the q4 kernels every op is this extension's
// own (decode_kernels.h, compiled here once per instruction set and chosen at run time), and a
// decode step's run of layers is one call (decode_layers); with torch's kernels the same ATen calls
// in the same order as the Python step give the same numbers bit for bit (the tests compare with
// torch.equal) and cost only the dispatcher's share. Built once per machine by
// model/lowbit/native_kernels.py; everything else (prefill, float weights, other devices) stays on
// the Python path.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define SKIPDECODE_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
// The AMX tiles' kernels (amx_kernels.h) need a compiler that knows the AMX target (GCC 11, clang 12)
// and Linux (the tile data is granted by arch_prctl); elsewhere q4_amx() is false and nothing changes.
#if defined(SKIPDECODE_X86) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define SKIPDECODE_AMX 1
#endif

// The kernels, compiled once per instruction set (model/lowbit/decode_kernels.h says what they compute).
#ifdef SKIPDECODE_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define SD_AVX512 0
#include "decode_kernels.h"
#undef SD_AVX512
}  // namespace avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
namespace avx512 {
#define SD_AVX512 1
#include "decode_kernels.h"
#undef SD_AVX512
}  // namespace avx512
#pragma GCC pop_options
#ifdef SKIPDECODE_AMX
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
namespace amx {
using avx512::bf16_to_float;
#include "amx_kernels.h"
}  // namespace amx
#pragma GCC pop_options
#endif
#endif

namespace {

using at::Tensor;

constexpr int64_t kInt4Group = 32;  // the GGUF Q4_1 block size (model/lowbit/quantization.py, INT4_GROUP)

// --- which instruction set's kernels run (chosen once from the CPU; set_q4_isa forces one) -----

enum class Isa { none, avx2, avx512 };

bool cpu_has(Isa isa) {
#ifdef SKIPDECODE_X86
  __builtin_cpu_init();
  if (isa == Isa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == Isa::avx512) {
    return cpu_has(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
  }
#endif
  return false;
}

Isa best_isa() { return cpu_has(Isa::avx512) ? Isa::avx512 : cpu_has(Isa::avx2) ? Isa::avx2 : Isa::none; }

Isa active_isa = best_isa();

const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512-vnni" : isa == Isa::avx2 ? "avx2" : ""; }

std::string q4_isa() { return isa_name(active_isa); }

// "avx512-vnni", "avx2" or "auto" (the CPU's best); false where this CPU lacks it (nothing changes).
bool set_q4_isa(const std::string& name) {
  const Isa wanted = name == "auto" ? best_isa() : name == "avx512-vnni" ? Isa::avx512 : name == "avx2" ? Isa::avx2 : Isa::none;
  if (wanted == Isa::none || !cpu_has(wanted)) return false;
  active_isa = wanted;
  return true;
}

std::vector<std::string> q4_isas() {
  std::vector<std::string> names;
  for (Isa isa : {Isa::avx512, Isa::avx2}) {
    if (cpu_has(isa)) names.emplace_back(isa_name(isa));
  }
  return names;
}

bool has_q4_matmul() { return active_isa != Isa::none; }

// From how many rows a q4 matmul runs on AMX tiles (amx_kernels.h) where the CPU and the kernel
// allow them (q4_amx); 0: never. Set by native_kernels.py from SKIPDECODE_Q4_AMX_ROWS.
int64_t amx_rows = 0;

bool q4_amx() {
#ifdef SKIPDECODE_AMX
  static const bool usable = cpu_has(Isa::avx512) && amx::amx_usable();  // asks the kernel once
  return usable;
#else
  return false;
#endif
}

#ifdef SKIPDECODE_AMX
// Rows of x times the Q4 weights on AMX tiles where they are due (usable here, rows >= amx_rows):
// the whole groups of 16 columns; returns how many columns it multiplied (0: none, all left to the
// vector kernels). q4_matmul calls it, and the decode layers through their hook (decode_kernels.h,
// tile_matmul).
int64_t tile_matmul_if_due(const float* x, int64_t rows, int64_t width, const avx512::Q4Weights& w, bool coarse,
                           float* y, int64_t y_stride) {
  if (amx_rows == 0 || rows < amx_rows || w.outputs < 16 || !q4_amx()) return 0;
  amx::q4_amx_matmul(x, rows, width, w.qs, w.sz, w.amx, w.outputs, coarse, y, y_stride);
  return w.outputs / 16 * 16;
}
#endif

void set_q4_amx_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "set_q4_amx_rows: 0 (never) or a row count");
  amx_rows = rows;
#ifdef SKIPDECODE_AMX
  avx512::tile_matmul = rows > 0 ? &tile_matmul_if_due : nullptr;
#endif
}

int64_t q4_amx_rows() { return amx_rows; }

// From how many rows an int8 projection multiplies its weights as bfloat16 (their integer values,
// exact in bfloat16) through at::linear, oneDNN's AMX-BF16 path, then scales the columns, instead of
// torch's int8 kernel, which costs the same per row at any batch; 0: never. Set by native_kernels.py
// (int8_bf16_rows), which computes the Python step's int8 rows the same way (int8_rows_mm).
int64_t int8_bf16_rows = 0;

void set_int8_bf16_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "set_int8_bf16_rows: 0 (never) or a row count");
  int8_bf16_rows = rows;
}

// (N, in) bfloat16 rows times int8 weights (O, in) with bfloat16 column scales: (N, O) bfloat16.
// bf16: the module's kept bfloat16 copy of the weights (Int8WeightLinear.weight_bf16), or none
// (undefined or empty: converted here, at each call).
Tensor int8_rows_mm(const Tensor& rows, const Tensor& weight, const Tensor& scales, const c10::optional<Tensor>& bf16) {
  if (int8_bf16_rows > 0 && rows.size(0) >= int8_bf16_rows) {
    const bool kept = bf16.has_value() && bf16->defined() && bf16->numel() > 0;
    return at::linear(rows, kept ? *bf16 : weight.to(at::kBFloat16)).mul_(scales);
  }
  return at::_weight_int8pack_mm(rows, weight, scales);
}

// Per calling thread: the fused step's and the kernels' scratch (a request thread at a time runs a
// decoder; OpenMP's workers only read and write the slices they are given).
float* scratch_floats(int64_t count) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

#ifdef SKIPDECODE_X86
#define SD_KERNEL(name) (active_isa == Isa::avx512 ? avx512::name : avx2::name)
#endif

void check_q4() { TORCH_CHECK(active_isa != Isa::none, "the q4 kernels need an x86-64 CPU with AVX2 and FMA"); }

// --- the q4 matmul and the LoRA's B, one call each (the two-stage head's scan, tests) ----------

// qs (O, K/2) with each row's superblocks of `blocks` Q4 blocks (16 bytes each) interleaved a piece at a
// time: piece c (`piece` bytes from byte c * piece) of block l lands at c * blocks * piece + l * piece,
// so one load takes piece c of every block of the superblock; the blocks past the last whole
// superblock stay as they are. The same bytes, reordered: a row reads as many as before.
Tensor interleaved_blocks(const Tensor& qs, int64_t blocks, int64_t piece, const char* name) {
  TORCH_CHECK(qs.dim() == 2 && qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.size(1) % 16 == 0, name,
              ": (O, K/2) uint8 Q4 bytes");
  const int64_t rows = qs.size(0), row_bytes = qs.size(1), super_bytes = blocks * 16, supers = row_bytes / super_bytes;
  Tensor out = qs.clone();
  const uint8_t* src = qs.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t sb = 0; sb < supers; ++sb) {
        const uint8_t* block = src + o * row_bytes + sb * super_bytes;
        uint8_t* chunk = dst + o * row_bytes + sb * super_bytes;
        for (int64_t c = 0; c < 16 / piece; ++c) {
          for (int64_t l = 0; l < blocks; ++l) std::memcpy(chunk + (c * blocks + l) * piece, block + l * 16 + c * piece, piece);
        }
      }
    }
  });
  return out;
}

// The Q4 bytes qs (O, K/2) in the AVX-512 lane kernel's layout (decode_kernels.h, q4_lane_tile): per
// row, each superblock of 16 blocks as 4 chunks of 64 bytes, chunk c holding bytes 4c .. 4c + 3 of
// block l at lane l (4 bytes).
Tensor q4_lanes(const Tensor& qs) { return interleaved_blocks(qs, 16, 4, "q4_lanes"); }

// The Q4 bytes qs (O, K/2) in the AVX2 lane kernel's layout (decode_kernels.h, avx2::q4_lane_tile), shaped
// (O, K/32, 16) (the shape tells the kernels which layout a lanes tensor holds): per row, each
// superblock of 8 blocks as 8 chunks of 16 bytes, chunk c holding bytes 2c, 2c + 1 of block l at 2l.
Tensor q4_lanes_avx2(const Tensor& qs) {
  return interleaved_blocks(qs, 8, 2, "q4_lanes_avx2").view({qs.size(0), qs.size(1) / 16, 16});
}

// lanes where they hold the layout of the instruction set whose Q4Weights W reads them (by shape), else
// nullptr (another set's layout, or none: that set's kernels then run without one)
template <class W>
const uint8_t* lanes_for(const c10::optional<Tensor>& lanes, const Tensor& qs) {
  if (!lanes.has_value() || lanes->numel() == 0 || lanes->dim() != W::lane_dims) return nullptr;
  const bool fits = W::lane_dims == 2 ? lanes->sizes() == qs.sizes()
                                      : lanes->size(0) == qs.size(0) && lanes->size(1) == qs.size(1) / 16 && lanes->size(2) == 16;
  TORCH_CHECK(fits && lanes->is_contiguous() && lanes->scalar_type() == at::kByte,
              "q4 lanes must be q4_lanes(qs) or q4_lanes_avx2(qs)");
  return lanes->data_ptr<uint8_t>();
}

// The Q4 blocks' whole groups of 16 rows (qs (O, K/2) uint8, sz (O, K/32, 2) bfloat16) in the AMX
// tiles' layout (amx_kernels.h, amx_layout): (O / 16, K / 32, 320) uint8; empty where this build or
// CPU has no AMX tiles.
Tensor q4_amx_layout(const Tensor& qs, const Tensor& sz) {
  TORCH_CHECK(qs.dim() == 2 && qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.size(1) % 16 == 0 &&
                  sz.dim() == 3 && sz.size(0) == qs.size(0) && sz.size(1) == qs.size(1) / 16 &&
                  sz.scalar_type() == at::kBFloat16 && sz.is_contiguous(),
              "q4_amx_layout: (O, K/2) uint8 Q4 bytes and their (O, K/32, 2) bfloat16 pairs");
  if (!q4_amx()) return qs.new_empty({0});
  const int64_t outputs = qs.size(0), blocks = qs.size(1) / 16;
  Tensor out = at::empty({outputs / 16, blocks, 320}, qs.options());
#ifdef SKIPDECODE_AMX
  amx::amx_layout(qs.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(sz.data_ptr<at::BFloat16>()), outputs,
                  blocks, out.data_ptr<uint8_t>());
#endif
  return out;
}

// amx (optional): q4_amx_layout(qs, sz), or empty
static const uint8_t* amx_bytes(const c10::optional<Tensor>& amx, const Tensor& qs) {
  if (!amx.has_value() || amx->numel() == 0) return nullptr;
  TORCH_CHECK(amx->dim() == 3 && amx->size(0) == qs.size(0) / 16 && amx->size(1) == qs.size(1) / 16 &&
                  amx->size(2) == 320 && amx->is_contiguous() && amx->scalar_type() == at::kByte,
              "the AMX layout must be q4_amx_layout(qs, sz)");
  return amx->data_ptr<uint8_t>();
}

// (N, K) float32 rows times Q4 blocks: qs (O, K/2) uint8, sz (O, K/32, 2) bfloat16 (scale, zero);
// lanes: qs in q4_lanes' layout (the AVX-512 lane kernel) or q4_lanes_avx2's (the AVX2 one; the other
// set's kernels, or either without: the layout-free kernels); amx: q4_amx_layout(qs, sz) (empty or
// absent: the tiles transpose the bytes on every call).
Tensor q4_matmul(const Tensor& input, const Tensor& qs, const Tensor& sz, bool coarse = false,
                 const c10::optional<Tensor>& lanes = c10::nullopt, const c10::optional<Tensor>& amx = c10::nullopt) {
  check_q4();
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat, "q4_matmul: (N, K) float32 rows");
  const Tensor x = input.contiguous();
  const int64_t rows = x.size(0), width = x.size(1), outputs = qs.size(0);
  TORCH_CHECK(width % 32 == 0 && qs.size(1) == width / 2 && sz.size(0) == outputs && sz.size(1) == width / 32 &&
                  sz.scalar_type() == at::kBFloat16 && qs.is_contiguous() && sz.is_contiguous(),
              "q4_matmul: shapes do not match");
  Tensor y = at::empty({rows, outputs}, x.options());
#ifdef SKIPDECODE_X86
  float* quant = scratch_floats(avx2::quant_floats(rows, width));
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto* qp = qs.data_ptr<uint8_t>();
  const auto* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::BFloat16>());
  if (active_isa == Isa::avx512) {
    avx512::Q4Weights w{qp, sp, outputs, width / 32};
    w.lanes = lanes_for<avx512::Q4Weights>(lanes, qs);
    w.amx = amx_bytes(amx, qs);
    int64_t vector_from = 0;  // AMX tiles take the whole groups of 16 columns, the vector kernel the rest
#ifdef SKIPDECODE_AMX
    vector_from = tile_matmul_if_due(xp, rows, width, w, coarse, yp, outputs);
#endif
    if (vector_from < outputs) {
      const auto q = avx512::quantize_rows(xp, rows, width, quant);
      at::parallel_for(vector_from, outputs, 16, [&](int64_t b, int64_t e) { avx512::q4_rows(w, q, yp, outputs, b, e, coarse); });
    }
  } else {
    const auto q = avx2::quantize_rows(xp, rows, width, quant);
    avx2::Q4Weights w{qp, sp, outputs, width / 32};
    w.lanes = lanes_for<avx2::Q4Weights>(lanes, qs);
    at::parallel_for(0, outputs, 16, [&](int64_t b, int64_t e) { avx2::q4_rows(w, q, yp, outputs, b, e); });
  }
#endif
  return y;
}

// (B, V) float32 logits -> (B,) int64: each row's argmax as torch's (the first of equal largest values;
// the first NaN where a row has one), the rows split between the threads.
Tensor argmax_rows(const Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() && logits.size(1) > 0,
              "argmax_rows: (B, V) float32 CPU logits");
#ifdef SKIPDECODE_X86
  if (active_isa == Isa::none) return at::argmax(logits, 1);
  const Tensor x = logits.contiguous();
  Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  const int64_t width = x.size(1);
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = SD_KERNEL(row_argmax)(xp + r * width, width);
  });
  return out;
#else
  return at::argmax(logits, 1);
#endif
}

// Multiply-adds a second of the active instruction set's q4 arithmetic on `threads` threads at once
// (decode_kernels.h, peak_multiply_adds; AVX-512 VNNI counts byte products: the q4 kernels' 16-bit
// activations take two of them a weight), timed over about `seconds`.
double q4_peak(int64_t threads, double seconds) {
  check_q4();
  const int64_t reps = 1 << 20;
  std::vector<int64_t> done(static_cast<size_t>(threads), 0);
  std::vector<int32_t> sink(static_cast<size_t>(threads) * 16, 0);
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (elapsed < seconds) {
#ifdef SKIPDECODE_X86
    at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) done[t] += SD_KERNEL(peak_multiply_adds)(reps, &sink[t * 16]);
    });
#endif
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double total = 0.0;
  for (int64_t count : done) total += static_cast<double>(count);
  return total / elapsed;
}

// The two-stage LM head (model/lowbit/quantization.py, TwoStageHead) in one call: the 4-bit scan of
// the whole vocabulary (q4 blocks qs, sz), then each row's top `candidates` rescored exactly with
// `rows` (V, C): the tied embedding's float32 rows, or int8 rows with bfloat16 `scales`.
Tensor two_stage_head(const Tensor& input, const Tensor& qs, const Tensor& sz, const Tensor& rows,
                      const c10::optional<Tensor>& scales, int64_t candidates,
                      const c10::optional<Tensor>& lanes = c10::nullopt,
                      const c10::optional<Tensor>& amx = c10::nullopt) {
  Tensor logits = q4_matmul(input, qs, sz, /*coarse=*/true, lanes, amx);  // a ranking: 8-bit activations suffice
  const Tensor x = input.contiguous();
  const int64_t vocab = logits.size(1), width = x.size(1);
  TORCH_CHECK(candidates >= 1 && candidates <= 256 && candidates <= vocab, "two_stage_head: 1 to 256 candidates");
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == vocab && rows.size(1) == width && rows.is_contiguous(),
              "two_stage_head: rescoring rows (V, C)");
  const bool int8 = rows.scalar_type() == at::kChar;
  TORCH_CHECK(int8 ? (scales.has_value() && scales->scalar_type() == at::kBFloat16 && scales->numel() == vocab)
                   : rows.scalar_type() == at::kFloat,
              "two_stage_head: float32 rows, or int8 rows with bfloat16 scales");
#ifdef SKIPDECODE_X86
  const float* float_rows = int8 ? nullptr : rows.data_ptr<float>();
  const int8_t* int8_rows = int8 ? rows.data_ptr<int8_t>() : nullptr;
  const auto* scale = int8 ? reinterpret_cast<const uint16_t*>(scales->data_ptr<at::BFloat16>()) : nullptr;
  SD_KERNEL(rescore_candidates)(x.data_ptr<float>(), x.size(0), width, logits.data_ptr<float>(), vocab,
                                static_cast<int>(candidates), float_rows, int8_rows, scale);
#endif
  return logits;
}

// (N, R) float rows times a LoRA's B^T held as int8 rows (O, W), each row's nonzero window of the
// block-diagonal B (q/k/v and gate/up fuse their LoRAs: most of B is zeros) starting at column
// start[o], one float scale a row: (N, O) float32. The float rows keep x A^T's precision.
// With `tiles` and `tile_start` (lora_b_layout's) on AVX2: its tiled kernel, as the native step runs it.
Tensor lora_b_matmul(const Tensor& input, const Tensor& window, const Tensor& start, const Tensor& scale,
                     const c10::optional<Tensor>& tiles = c10::nullopt, const c10::optional<Tensor>& tile_start = c10::nullopt) {
  check_q4();
  const Tensor x = input.contiguous();
  const int64_t rows = x.size(0), outputs = window.size(0), width = window.size(1);
  TORCH_CHECK(start.size(0) == outputs && scale.size(0) == outputs, "lora_b_matmul: shapes");
  Tensor y = at::zeros({rows, outputs}, x.options());
#ifdef SKIPDECODE_X86
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (active_isa == Isa::avx2 && tiles.has_value() && tiles->numel() > 0) {  // AVX2's tiled kernel (the native step's)
    TORCH_CHECK(tiles->dim() == 4 && tiles->size(0) * 16 == outputs && tile_start.has_value(), "lora_b_matmul: tiles");
    const int64_t tile_width = tiles->size(1) * 4;
    at::parallel_for(0, outputs / 16, 4, [&](int64_t b, int64_t e) {
      avx2::lora_b_tiles(xp, x.size(1), rows, tiles->data_ptr<int8_t>(), tile_width, tile_start->data_ptr<int32_t>(),
                         scale.data_ptr<float>(), yp, outputs, b, e);
    });
    return y;
  }
  const auto run = SD_KERNEL(lora_b_rows);
  at::parallel_for(0, outputs, 64, [&](int64_t b, int64_t e) {
    run(xp, x.size(1), rows, window.data_ptr<int8_t>(), width, start.data_ptr<int32_t>(), scale.data_ptr<float>(),
        yp, outputs, b, e);
  });
#endif
  return y;
}

// A LoRA's B (O, R) int8 (block-diagonal where q/k/v or gate/up fuse their LoRAs: most of it zeros)
// as the kernels read it: each row's window of width W (a multiple of 16 covering its nonzero
// columns) from column start[o], for lora_b_rows; and, where O % 16 == 0, tiles of 16 outputs, each
// the columns [tile_start, + TW) covering its rows' nonzero entries (TW a multiple of 4), bytes
// (TW / 4, 16, 4): columns 4i .. 4i + 3 of its outputs side by side, for lora_b_tiles (AVX-512 VNNI);
// window_sum[o]: the row's sum. One pass here: at start-up the same through torch ops took seconds.
std::vector<Tensor> lora_b_layout(const Tensor& weight) {
  const Tensor b = weight.contiguous();
  TORCH_CHECK(b.dim() == 2 && b.scalar_type() == at::kChar, "lora_b_layout: (O, R) int8");
  const int64_t rows = b.size(0), rank = b.size(1);
  const int8_t* bp = b.data_ptr<int8_t>();
  std::vector<int64_t> first(rows, rank), last(rows, -1);
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t j = 0; j < rank; ++j) {
      if (bp[o * rank + j] != 0) {
        first[o] = std::min(first[o], j);
        last[o] = j;
      }
    }
  }
  const auto width_of = [&](int64_t span, int64_t multiple) {
    return std::min(rank, (std::max<int64_t>(span, 1) + multiple - 1) / multiple * multiple);
  };
  int64_t span = 1;
  for (int64_t o = 0; o < rows; ++o) span = std::max(span, last[o] - first[o] + 1);
  const int64_t width = width_of(span, 16);
  Tensor window = at::empty({rows, width}, b.options()), start = at::empty({rows}, b.options().dtype(at::kInt));
  Tensor sums = at::empty({rows}, b.options().dtype(at::kInt));
  for (int64_t o = 0; o < rows; ++o) {
    const int64_t at = std::min(std::min(first[o], rank - 1), rank - width);
    start.data_ptr<int32_t>()[o] = static_cast<int32_t>(at);
    std::memcpy(window.data_ptr<int8_t>() + o * width, bp + o * rank + at, width);
    int32_t total = 0;
    for (int64_t j = 0; j < rank; ++j) total += bp[o * rank + j];
    sums.data_ptr<int32_t>()[o] = total;
  }
  Tensor tiles = at::empty({0}, b.options()), tile_start = at::empty({0}, b.options().dtype(at::kInt));
  if (rows % 16 == 0 && rank % 4 == 0) {
    const int64_t count = rows / 16;
    std::vector<int64_t> tile_first(count, rank), tile_last(count, -1);
    int64_t tile_span = 1;
    for (int64_t t = 0; t < count; ++t) {
      for (int64_t k = 0; k < 16; ++k) {
        tile_first[t] = std::min(tile_first[t], first[t * 16 + k]);
        tile_last[t] = std::max(tile_last[t], last[t * 16 + k]);
      }
      tile_span = std::max(tile_span, tile_last[t] - tile_first[t] + 1);
    }
    const int64_t tile_width = width_of(tile_span, 4);
    tiles = at::empty({count, tile_width / 4, 16, 4}, b.options());
    tile_start = at::empty({count}, b.options().dtype(at::kInt));
    int8_t* tp = tiles.data_ptr<int8_t>();
    for (int64_t t = 0; t < count; ++t) {
      const int64_t at = std::min(std::min(tile_first[t], rank - 1), rank - tile_width);
      tile_start.data_ptr<int32_t>()[t] = static_cast<int32_t>(at);
      for (int64_t i = 0; i < tile_width / 4; ++i) {
        for (int64_t k = 0; k < 16; ++k) {
          std::memcpy(tp + ((t * (tile_width / 4) + i) * 16 + k) * 4, bp + (t * 16 + k) * rank + at + 4 * i, 4);
        }
      }
    }
  }
  return {window, start, tiles, tile_start, sums};
}

// torch's packed int4 weights (N, K/2) -> the Q4_1 bytes q4_matmul reads (N, K/2): element (n, k)
// of each block of `period` rows sits in packed nibble nibble_of[(n % period) * K + k] of its block
// (a layout learned from torch's packer: model/lowbit/native_step.py). One pass over the bytes: at start-up
// the same gather through torch ops cost ~2 s for the default model.
Tensor q4_from_packed(const Tensor& packed, const Tensor& nibble_of, int64_t period) {
  const Tensor source = packed.contiguous();
  const int64_t rows = source.size(0), half = source.size(1), cols = half * 2;
  TORCH_CHECK(rows % period == 0 && nibble_of.numel() == period * cols && cols % 32 == 0, "q4_from_packed: shapes");
  Tensor out = at::empty_like(source);
  const uint8_t* sp = source.data_ptr<uint8_t>();
  const int64_t* np = nibble_of.data_ptr<int64_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  const auto code = [&](int64_t block_start, int64_t nibble) -> uint8_t {
    const uint8_t byte = sp[block_start + nibble / 2];
    return (nibble & 1) ? (byte >> 4) : (byte & 0x0F);
  };
  at::parallel_for(0, rows, period, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t block_start = (n / period) * period * half;  // bytes before this block of rows
      const int64_t* row_nibbles = np + (n % period) * cols;
      uint8_t* row_out = op + n * half;
      for (int64_t b = 0; b < cols / 32; ++b) {
        for (int64_t j = 0; j < 16; ++j) {
          const uint8_t low = code(block_start, row_nibbles[b * 32 + j]);
          const uint8_t high = code(block_start, row_nibbles[b * 32 + j + 16]);
          row_out[b * 16 + j] = static_cast<uint8_t>(low | (high << 4));
        }
      }
    }
  });
  return out;
}

// One low-bit projection of (B, in) float rows, exactly as model/lowbit/quantization.py computes it.
struct Projection {
  // 0: int4; 1: int4 with a LoRA (A stacked under the base rows, B in int8); 2: int8;
  // 3: Q4 blocks through q4_matmul; 4: those with a LoRA (A's blocks stacked, B in int8)
  int64_t kind;
  // 0: packed, scales_and_zeros; 1: + B int8, B scales; 2: int8 rows, scales; 3: qs, sz, lanes;
  // 4: qs, sz, B's nonzero windows (int8), their start columns, float scales (lora_b_matmul), and the
  // windows as tiles of 16 outputs, each tile's start column, each window's sum (empty: no tiles),
  // lanes and amx last (kinds 3 and 4: qs in q4_lanes' layout, empty where the CPU has no AVX-512
  // VNNI; the blocks in q4_amx_layout, empty where it has no AMX tiles)
  std::vector<Tensor> tensors;
  int64_t out;  // output features (1, 4: the base's; the stacked rows add the rank)

  Tensor operator()(const Tensor& x) const {
    if (kind >= 3) {
      const Tensor both = q4_matmul(x, tensors[0], tensors[1], false, tensors.end()[-2], tensors.back());  // float32 (N, out [+ r])
      if (kind == 3) return both;
      return both.narrow(1, 0, out).add(lora_b_matmul(both.narrow(1, out, both.size(1) - out), tensors[2],
                                                      tensors[3], tensors[4]));
    }
    const Tensor rows = x.to(at::kBFloat16);
    if (kind == 2) {
      return int8_rows_mm(rows, tensors[0], tensors[1], tensors[2]).to(x.scalar_type());
    }
    const Tensor both = at::_weight_int4pack_mm_for_cpu(rows, tensors[0], kInt4Group, tensors[1]);
    if (kind == 0) {
      return both.to(x.scalar_type());
    }
    // Int4LoraLinear.forward: base | x A^T from one call, then + (x A^T) B^T with B in int8.
    const Tensor delta = at::_weight_int8pack_mm(both.narrow(1, out, both.size(1) - out), tensors[2], tensors[3]);
    return both.narrow(1, 0, out).to(x.scalar_type(), /*non_blocking=*/false, /*copy=*/true).add_(delta);
  }
};

#ifdef SKIPDECODE_X86
// A q4 projection as the fused layer reads it (the tensors stay alive in the layer's Projection).
template <class View>
View q4_view(const Projection& p) {
  View view;
  const Tensor& qs = p.tensors[0];
  view.w = {qs.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(p.tensors[1].data_ptr<at::BFloat16>()),
            qs.size(0), qs.size(1) / 16};
  view.w.lanes = lanes_for<decltype(view.w)>(p.tensors.end()[-2], qs);  // the lane kernel's layout (empty: none)
  view.w.amx = amx_bytes(p.tensors.back(), qs);  // the AMX tiles' layout (empty: none)
  view.out = p.out;
  if (p.kind == 4) {
    view.window = p.tensors[2].data_ptr<int8_t>();
    view.window_width = p.tensors[2].size(1);
    view.start = p.tensors[3].data_ptr<int32_t>();
    view.scale = p.tensors[4].data_ptr<float>();
    if (p.tensors[5].numel() > 0) {  // the windows in tiles of 16 outputs (model/lowbit/native_kernels.py)
      view.tiles = p.tensors[5].data_ptr<int8_t>();
      view.tile_width = p.tensors[5].size(1) * 4;
      view.tile_start = p.tensors[6].data_ptr<int32_t>();
      view.window_sum = p.tensors[7].data_ptr<int32_t>();
    }
  }
  return view;
}

template <class LayerView, class ProjectionView>
LayerView layer_view(const std::vector<Projection>& p, const Tensor& input_norm, double input_eps,
                     const Tensor& post_norm, double post_eps, double scaling, int64_t heads, int64_t kv_heads,
                     int64_t head_dim) {
  LayerView view;
  view.input_norm = input_norm.data_ptr<float>();
  view.post_norm = post_norm.data_ptr<float>();
  view.input_eps = static_cast<float>(input_eps);
  view.post_eps = static_cast<float>(post_eps);
  view.scaling = static_cast<float>(scaling);
  view.qkv = q4_view<ProjectionView>(p[0]);
  view.o = q4_view<ProjectionView>(p[1]);
  view.gate_up = q4_view<ProjectionView>(p[2]);
  view.down = q4_view<ProjectionView>(p[3]);
  view.heads = heads;
  view.kv_heads = kv_heads;
  view.head_dim = head_dim;
  view.hidden = input_norm.size(0);
  view.intermediate = p[2].out / 2;
  return view;
}
#endif

class DecodeLayer {
 public:
  DecodeLayer(Tensor input_norm, double input_eps, Tensor post_norm, double post_eps,
              std::vector<std::tuple<int64_t, std::vector<Tensor>, int64_t>> projections,
              double scaling, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim)
      : input_norm_(input_norm.contiguous()), post_norm_(post_norm.contiguous()),
        input_eps_(input_eps), post_eps_(post_eps), scaling_(scaling),
        num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
    TORCH_CHECK(projections.size() == 4, "DecodeLayer needs q/k/v, o, gate/up and down");
    for (auto& [kind, tensors, out] : projections) {
      static const size_t counts[] = {2, 4, 3, 4, 10};  // kind 2: int8, scales, the kept bfloat16 copy (or empty)
      TORCH_CHECK(kind >= 0 && kind <= 4, "unknown projection kind ", kind);
      TORCH_CHECK(tensors.size() == counts[kind], "projection kind ", kind, ": wrong tensor count");
      fused_ = fused_ && kind >= 3;
      projections_.push_back(Projection{kind, std::move(tensors), out});
    }
    fused_ = fused_ && head_dim <= 512 && num_heads % num_kv_heads == 0 &&
             input_norm_.scalar_type() == at::kFloat && post_norm_.scalar_type() == at::kFloat;
  }

  // True where every op of the step runs in decode_kernels.h (`decode`); else `__call__`.
  bool fused() const { return fused_; }

  // flat: (B, C) float rows of one new position each; keys/values: the layer's (B, Hkv, capacity,
  // D) cache buffers, written at `start`; rotation: (B, 1, D, D) (lean_layer.py, step_rotation).
  // torch's ops in the Python step's order: bit for bit that step with torch's kernels.
  Tensor operator()(const Tensor& flat, const Tensor& rotation, const Tensor& keys, const Tensor& values,
                    int64_t start, const c10::optional<Tensor>& mask) const {
    const int64_t batch = flat.size(0);
    const Tensor heads = projections_[0](at::rms_norm(flat, {flat.size(1)}, input_norm_, input_eps_))
                             .view({batch, -1, 1, head_dim_});  // (B, Hq + 2 Hkv, 1, D)
    const int64_t rotating = num_heads_ + num_kv_heads_;
    const Tensor rotated = at::matmul(heads.narrow(1, 0, rotating), rotation);
    keys.narrow(2, start, 1).copy_(rotated.narrow(1, num_heads_, num_kv_heads_));
    values.narrow(2, start, 1).copy_(heads.narrow(1, rotating, num_kv_heads_));
    const Tensor attended = at::scaled_dot_product_attention(
        rotated.narrow(1, 0, num_heads_), keys.narrow(2, 0, start + 1), values.narrow(2, 0, start + 1), mask,
        /*dropout_p=*/0.0, /*is_causal=*/false, scaling_, /*enable_gqa=*/num_kv_heads_ != num_heads_);
    const Tensor hidden = flat + projections_[1](attended.reshape({batch, -1}));
    const auto gate_up = projections_[2](at::rms_norm(hidden, {hidden.size(1)}, post_norm_, post_eps_)).chunk(2, -1);
    return hidden + projections_[3](at::silu(gate_up[0]) * gate_up[1]);
  }

  // The same step with every op in decode_kernels.h (q4 projections only): norms, the q4 matmuls
  // and the LoRA's B, rotary from the step's (B, 1, D) cos and sin, the cache writes, attention over
  // the layer's cached prefix, SiLU gate and residuals. Which earlier keys a row attends to: `mask`
  // (B, 1, 1, start + 1) bool as the Python step takes it, or `key_valid` (B, capacity) bool (the
  // decoder's, model/skipdecode/decoder.py), or neither: all.
  Tensor decode(const Tensor& flat, const Tensor& cos, const Tensor& sin, const Tensor& keys, const Tensor& values,
                int64_t start, const c10::optional<Tensor>& mask, const c10::optional<Tensor>& key_valid = c10::nullopt) const {
    TORCH_CHECK(fused_, "DecodeLayer.decode: not every projection is a q4 one");
    check_q4();
    const int64_t batch = flat.size(0);
    const Tensor x = flat.contiguous(), c = cos.contiguous(), s = sin.contiguous();
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == input_norm_.size(0) &&
                    c.numel() == batch * head_dim_ && s.numel() == batch * head_dim_ && keys.is_contiguous() &&
                    values.is_contiguous() && keys.scalar_type() == at::kFloat && values.sizes() == keys.sizes() &&
                    keys.size(0) == batch && keys.size(1) == num_kv_heads_ && keys.size(3) == head_dim_ &&
                    start < keys.size(2),
                "DecodeLayer.decode: rows, rotary or cache of the wrong shape");
    Tensor allowed;
    int64_t allowed_stride = 0;
    if (mask.has_value() && mask->defined()) {
      allowed = mask->to(at::kBool).contiguous();
      allowed_stride = start + 1;
      TORCH_CHECK(allowed.numel() == batch * allowed_stride, "DecodeLayer.decode: the mask must cover start + 1 keys");
    } else if (key_valid.has_value() && key_valid->defined()) {
      allowed = key_valid->to(at::kBool).contiguous();
      allowed_stride = allowed.size(-1);
      TORCH_CHECK(allowed.numel() == batch * allowed_stride && allowed_stride > start,
                  "DecodeLayer.decode: key_valid must be (B, capacity)");
    }
    Tensor out = at::empty_like(x);
#ifdef SKIPDECODE_X86
    const auto run = [&](auto tag) {
      using Tag = decltype(tag);
      const auto layer = layer_view<typename Tag::Layer, typename Tag::Projection>(
          projections_, input_norm_, input_eps_, post_norm_, post_eps_, scaling_, num_heads_, num_kv_heads_, head_dim_);
      const typename Tag::Step step{x.data_ptr<float>(), batch, c.data_ptr<float>(), s.data_ptr<float>(),
                                    keys.data_ptr<float>(), values.data_ptr<float>(), keys.size(2), start,
                                    allowed.defined() ? allowed.data_ptr<bool>() : nullptr, allowed_stride,
                                    out.data_ptr<float>()};
      Tag::run(layer, step, scratch_floats(Tag::scratch(layer, batch, start + 1)));
    };
    if (active_isa == Isa::avx512) {
      run(Avx512Tag());
    } else {
      run(Avx2Tag());
    }
#endif
    return out;
  }

 private:
#ifdef SKIPDECODE_X86
  struct Avx2Tag {
    using Layer = avx2::LayerView;
    using Projection = avx2::ProjectionView;
    using Step = avx2::StepView;
    static int64_t scratch(const Layer& l, int64_t rows, int64_t length) { return avx2::layer_scratch_floats(l, rows, length); }
    static void run(const Layer& l, const Step& s, float* scratch) { avx2::decode_layer(l, s, scratch); }
  };
  struct Avx512Tag {
    using Layer = avx512::LayerView;
    using Projection = avx512::ProjectionView;
    using Step = avx512::StepView;
    static int64_t scratch(const Layer& l, int64_t rows, int64_t length) { return avx512::layer_scratch_floats(l, rows, length); }
    static void run(const Layer& l, const Step& s, float* scratch) { avx512::decode_layer(l, s, scratch); }
  };
#endif
  Tensor input_norm_, post_norm_;
  double input_eps_, post_eps_, scaling_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  std::vector<Projection> projections_;
  bool fused_ = true;
};

// A decode step's run of consecutive fused layers in one call (no interpreter between them): layer
// i reads and writes its cache buffers keys[i], values[i] at starts[i]; key_valid (B, capacity) as
// in DecodeLayer.decode.
Tensor decode_layers(const std::vector<const DecodeLayer*>& layers, const Tensor& hidden, const Tensor& cos,
                     const Tensor& sin, const std::vector<Tensor>& keys, const std::vector<Tensor>& values,
                     const std::vector<int64_t>& starts, const c10::optional<Tensor>& key_valid) {
  TORCH_CHECK(keys.size() == layers.size() && values.size() == layers.size() && starts.size() == layers.size(),
              "decode_layers: one cache slot per layer");
  Tensor h = hidden;
  for (size_t i = 0; i < layers.size(); ++i) h = layers[i]->decode(h, cos, sin, keys[i], values[i], starts[i], c10::nullopt, key_valid);
  return h;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  // Every call releases the GIL: the arguments are converted first, and the work is torch's and
  // ours alone, so other request threads (and the server's own) run meanwhile, as they do between
  // the Python step's torch calls.
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  module.def("q4_matmul", &q4_matmul, release(), "(N, K) float32 rows times Q4 blocks (qs, sz): (N, O) float32",
             pybind11::arg("input"), pybind11::arg("qs"), pybind11::arg("sz"), pybind11::arg("coarse") = false,
             pybind11::arg("lanes") = pybind11::none(), pybind11::arg("amx") = pybind11::none());
  module.def("q4_lanes", &q4_lanes, release(), "Q4 bytes in the AVX-512 lane kernel's layout");
  module.def("q4_lanes_avx2", &q4_lanes_avx2, release(), "Q4 bytes in the AVX2 lane kernel's layout (O, K/32, 16)");
  module.def("q4_amx_layout", &q4_amx_layout, release(), "Q4 blocks' whole groups of 16 rows in the AMX tiles' layout");
  module.def("q4_peak", &q4_peak, release(), "multiply-adds a second of the active q4 instruction set (threads, seconds)");
  module.def("lora_b_matmul", &lora_b_matmul, release(), "(N, R) float32 times int8 windows of B^T: (N, O) float32",
             pybind11::arg("input"), pybind11::arg("window"), pybind11::arg("start"), pybind11::arg("scale"),
             pybind11::arg("tiles") = pybind11::none(), pybind11::arg("tile_start") = pybind11::none());
  module.def("two_stage_head", &two_stage_head, release(),
             "(N, C) float32: the 4-bit scan's logits, each row's top candidates rescored exactly: (N, V) float32",
             pybind11::arg("input"), pybind11::arg("qs"), pybind11::arg("sz"), pybind11::arg("rows"),
             pybind11::arg("scales"), pybind11::arg("candidates"), pybind11::arg("lanes") = pybind11::none(),
             pybind11::arg("amx") = pybind11::none());
  module.def("argmax_rows", &argmax_rows, release(), "(B, V) float32 logits: each row's argmax, as torch's (B,) int64");
  module.def("has_q4_matmul", &has_q4_matmul);
  module.def("q4_amx", &q4_amx, "whether this CPU and kernel let the q4 matmul run on AMX tiles");
  module.def("set_q4_amx_rows", &set_q4_amx_rows, "q4 matmuls of this many rows or more: AMX tiles where usable (0: never)");
  module.def("q4_amx_rows", &q4_amx_rows);
  module.def("set_int8_bf16_rows", &set_int8_bf16_rows,
             "int8 projections of this many rows or more: bfloat16 weights through at::linear (0: never)");
  module.def("int8_rows_mm", &int8_rows_mm, release(), "int8 projection rows as the native step computes them",
             pybind11::arg("rows"), pybind11::arg("weight"), pybind11::arg("scales"), pybind11::arg("bf16") = pybind11::none());
  module.def("lora_b_layout", &lora_b_layout, release(), "a LoRA's int8 B as windows and tiles (the kernels' layouts)");
  module.def("q4_isa", &q4_isa, "the instruction set the q4 kernels run on: avx512-vnni, avx2, or '' (none)");
  module.def("q4_isas", &q4_isas, "the instruction sets this CPU can run the q4 kernels on, best first");
  module.def("set_q4_isa", &set_q4_isa, "force avx512-vnni or avx2 (or auto); False where the CPU lacks it");
  module.def("q4_from_packed", &q4_from_packed, release(), "torch's packed int4 rows as Q4_1 bytes (learned layout)");
  pybind11::class_<DecodeLayer>(module, "DecodeLayer")
      .def(pybind11::init<Tensor, double, Tensor, double,
                          std::vector<std::tuple<int64_t, std::vector<Tensor>, int64_t>>,
                          double, int64_t, int64_t, int64_t>())
      .def_property_readonly("fused", &DecodeLayer::fused)
      .def("__call__", &DecodeLayer::operator(), release())
      .def("decode", &DecodeLayer::decode, release(), pybind11::arg("flat"), pybind11::arg("cos"), pybind11::arg("sin"),
           pybind11::arg("keys"), pybind11::arg("values"), pybind11::arg("start"), pybind11::arg("mask"),
           pybind11::arg("key_valid") = pybind11::none());
  module.def("decode_layers", &decode_layers, release(), "consecutive fused layers of one decode step in one call");
}
