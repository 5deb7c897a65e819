// The lean Llama-family layer's decode step (model/skipdecode/architectures.py, LeanLlamaLayer._decode_one)
// as one C++ call over torch's own ops, for low-bit projections on a CPU.
//
// Why: a small model's decode step on a CPU is a few hundred small ops, and at one thread the
// Python interpreter's cost per op call (argument parsing, the Python-side dispatch) is a large
// share of each layer. The same ATen calls in the same order from C++ give the same numbers bit
// for bit (the tests compare with torch.equal) and cost only the dispatcher's share. Built once
// per machine by model/lowbit/native_step.py; everything else (prefill, float weights, other devices)
// stays on the Python path.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SKIPDECODE_Q4 1
#endif

namespace {

using at::Tensor;

constexpr int64_t kInt4Group = 32;  // the GGUF Q4_1 block size (model/lowbit/quantization.py, INT4_GROUP)

// --- a 4-bit matmul for few rows (decode) on AVX2 ------------------------------------------------
//
// Weights as the GGUF's Q4_1 blocks: w[o, 32 b + j] = d[o, b] * q + m[o, b], q in 0..15, byte j of
// a block's 16 holding q for j (low nibble) and j + 16 (high). Activations are quantised per block of
// 32 to int16 (scale = max|x| / 32767: a relative error ~1e-5, far below the bfloat16 activations
// of torch's int4 kernel), so a block's dot product is integer multiply-adds (vpmaddwd), one float
// scale per block, and m times the block's float sum. Why: torch's int4 CPU kernel converts to
// bfloat16, which an AVX2-only CPU computes in software: ~3 GB/s of weights on one thread, where
// this streams ~6 (README, "Speed").
#ifdef SKIPDECODE_Q4
// One weight row in Q4_1 blocks.
struct Q4Row {
  const uint8_t* qs;
  const float* d;
  const float* m;
  int64_t blocks;
};

// y[r, o] for R rows of x at once (R a constant: the accumulators stay in registers, and each
// block's nibbles are expanded once for all R rows).
template <int R>
inline void q4_dot(const Q4Row& row, const int16_t* codes, const float* scales, const float* sums, int64_t width,
                   int64_t first, float* out, int64_t out_stride) {
  const __m256i low_nibbles = _mm256_set1_epi16(0x0F);
  const int64_t blocks = row.blocks;
  // Two accumulators a row (even and odd blocks): one fused multiply-add chain would wait on its
  // own latency at every block.
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  const auto block = [&](int64_t b, __m256* acc) {
    // The block's 16 bytes widened once to 16-bit lanes (q[j] | q[j + 16] << 4 each): the low
    // nibbles by a mask, the high ones by a shift (fewer shuffles than widening each half).
    const __m256i both = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.qs + b * 16)));
    const __m256i low = _mm256_and_si256(both, low_nibbles);
    const __m256i high = _mm256_srli_epi16(both, 4);
    const __m256 weight_scale = _mm256_broadcast_ss(row.d + b);
    for (int r = 0; r < R; ++r) {
      const int16_t* xb = codes + (first + r) * width + b * 32;
      const __m256i dot = _mm256_add_epi32(
          _mm256_madd_epi16(low, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb))),
          _mm256_madd_epi16(high, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16))));
      const __m256 scale = _mm256_mul_ps(weight_scale, _mm256_broadcast_ss(scales + (first + r) * blocks + b));
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[r]);
    }
  };
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    block(b, even);
    block(b + 1, odd);
  }
  if (b < blocks) block(b, even);
  for (int r = 0; r < R; ++r) {
    const float* block_sums = sums + (first + r) * blocks;
    float offset = 0.f;  // sum over blocks of m times the block's float sum of x
    for (int64_t b = 0; b < blocks; ++b) offset += row.m[b] * block_sums[b];
    const __m256 total = _mm256_add_ps(even[r], odd[r]);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    out[(first + r) * out_stride] = _mm_cvtss_f32(s) + offset;
  }
}

Tensor q4_matmul(const Tensor& input, const Tensor& qs, const Tensor& d, const Tensor& m) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat, "q4_matmul: (N, K) float32 rows");
  const Tensor x = input.contiguous();
  const int64_t rows = x.size(0), width = x.size(1), outputs = qs.size(0), blocks = width / 32;
  TORCH_CHECK(width % 32 == 0 && qs.size(1) == width / 2 && d.size(1) == blocks && m.size(1) == blocks,
              "q4_matmul: shapes do not match");
  Tensor codes = at::empty({rows, width}, x.options().dtype(at::kShort));
  Tensor scales = at::empty({rows, blocks}, x.options());
  Tensor sums = at::empty({rows, blocks}, x.options());
  const float* xp = x.data_ptr<float>();
  int16_t* cp = codes.data_ptr<int16_t>();
  float* sp = scales.data_ptr<float>();
  float* up = sums.data_ptr<float>();
  for (int64_t i = 0; i < rows * blocks; ++i) {
    const float* v = xp + i * 32;
    float largest = 0.f, sum = 0.f;
    for (int j = 0; j < 32; ++j) {
      largest = std::max(largest, std::fabs(v[j]));
      sum += v[j];
    }
    const float inverse = largest > 0.f ? 32767.f / largest : 0.f;
    for (int j = 0; j < 32; ++j) cp[i * 32 + j] = static_cast<int16_t>(std::nearbyint(v[j] * inverse));
    sp[i] = largest / 32767.f;
    up[i] = sum;
  }
  Tensor y = at::empty({rows, outputs}, x.options());
  float* yp = y.data_ptr<float>();
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const float* dp = d.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  at::parallel_for(0, outputs, 32, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const Q4Row row{qp + o * (width / 2), dp + o * blocks, mp + o * blocks, blocks};
      int64_t first = 0;
      for (; first + 4 <= rows; first += 4) q4_dot<4>(row, cp, sp, up, width, first, yp + o, outputs);
      switch (rows - first) {  // the rest: a decode step's one row, or a batch's last few
        case 3: q4_dot<3>(row, cp, sp, up, width, first, yp + o, outputs); break;
        case 2: q4_dot<2>(row, cp, sp, up, width, first, yp + o, outputs); break;
        case 1: q4_dot<1>(row, cp, sp, up, width, first, yp + o, outputs); break;
        default: break;
      }
    }
  });
  return y;
}

// (N, R) float rows times a LoRA's B^T held as int8 rows (O, W), each row's nonzero window of the
// block-diagonal B (q/k/v and gate/up fuse their LoRAs: most of B is zeros) starting at column
// start[o], one float scale a row: (N, O) float32. The float rows keep x A^T's precision (torch's
// int8 kernel takes bfloat16, which AVX2 computes in software).
Tensor lora_b_matmul(const Tensor& input, const Tensor& window, const Tensor& start, const Tensor& scale) {
  const Tensor x = input.contiguous();
  const int64_t rows = x.size(0), rank = x.size(1), outputs = window.size(0), width = window.size(1);
  TORCH_CHECK(width % 8 == 0 && start.size(0) == outputs && scale.size(0) == outputs, "lora_b_matmul: shapes");
  Tensor y = at::empty({rows, outputs}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = window.data_ptr<int8_t>();
  const int32_t* sp = start.data_ptr<int32_t>();
  const float* cp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, outputs, 64, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int8_t* weights = wp + o * width;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * rank + sp[o];
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = 0; j < width; j += 8) {
          const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(weights + j));
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), _mm256_loadu_ps(xr + j), acc);
        }
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        s = _mm_hadd_ps(s, s);
        s = _mm_hadd_ps(s, s);
        yp[r * outputs + o] = _mm_cvtss_f32(s) * cp[o];
      }
    }
  });
  return y;
}
#else
Tensor lora_b_matmul(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TORCH_CHECK(false, "lora_b_matmul needs AVX2 and FMA (this build has neither)");
}
Tensor q4_matmul(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TORCH_CHECK(false, "q4_matmul needs AVX2 and FMA (this build has neither)");
}
#endif

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

bool has_q4_matmul() {
#ifdef SKIPDECODE_Q4
  return true;
#else
  return false;
#endif
}

// One low-bit projection of (B, in) float rows, exactly as model/lowbit/quantization.py computes it.
struct Projection {
  // 0: int4; 1: int4 with a LoRA (A stacked under the base rows, B in int8); 2: int8;
  // 3: Q4_1 blocks through q4_matmul; 4: those with a LoRA (A's blocks stacked, B in int8)
  int64_t kind;
  // 0: packed, scales_and_zeros; 1: + B int8, B scales; 2: int8 rows, scales; 3: qs, d, m;
  // 4: + B's nonzero windows (int8), their start columns, float scales (lora_b_matmul)
  std::vector<Tensor> tensors;
  int64_t out;  // output features (1, 4: the base's; the stacked rows add the rank)

  Tensor operator()(const Tensor& x) const {
    if (kind >= 3) {
      const Tensor both = q4_matmul(x, tensors[0], tensors[1], tensors[2]);  // float32 (N, out [+ r])
      if (kind == 3) return both;
      return both.narrow(1, 0, out).add(lora_b_matmul(both.narrow(1, out, both.size(1) - out), tensors[3],
                                                      tensors[4], tensors[5]));
    }
    const Tensor rows = x.to(at::kBFloat16);
    if (kind == 2) {
      return at::_weight_int8pack_mm(rows, tensors[0], tensors[1]).to(x.scalar_type());
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

// RMSNorm of (B, C) float32 rows, x * rsqrt(mean(x^2) + eps) * weight, as one loop: torch's own
// rms_norm costs ~28 us a call on an AVX2-only CPU at one thread for a 576-wide row, two calls a
// layer. Used with the q4 projections only (their steps are close to, not bit for bit, the Python
// step's anyway); the torch-kernel layouts keep at::rms_norm and stay bit for bit.
Tensor rms_norm_rows(const Tensor& x, const Tensor& weight, double eps) {
  const Tensor rows = x.contiguous();
  const int64_t count = rows.size(0), width = rows.size(1);
  Tensor out = at::empty_like(rows);
  const float* xp = rows.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < count; ++r) {
    const float* v = xp + r * width;
    float squares = 0.f;
    for (int64_t j = 0; j < width; ++j) squares += v[j] * v[j];
    const float scale = 1.f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
    for (int64_t j = 0; j < width; ++j) op[r * width + j] = v[j] * scale * wp[j];
  }
  return out;
}

class DecodeLayer {
 public:
  DecodeLayer(Tensor input_norm, double input_eps, Tensor post_norm, double post_eps,
              std::vector<std::tuple<int64_t, std::vector<Tensor>, int64_t>> projections,
              double scaling, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim)
      : input_norm_(std::move(input_norm)), post_norm_(std::move(post_norm)),
        input_eps_(input_eps), post_eps_(post_eps), scaling_(scaling),
        num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
    TORCH_CHECK(projections.size() == 4, "DecodeLayer needs q/k/v, o, gate/up and down");
    for (auto& [kind, tensors, out] : projections) {
      static const size_t counts[] = {2, 4, 2, 3, 6};
      TORCH_CHECK(kind >= 0 && kind <= 4, "unknown projection kind ", kind);
      TORCH_CHECK(tensors.size() == counts[kind], "projection kind ", kind, ": wrong tensor count");
      exact_ops_ = exact_ops_ && kind < 3;
      projections_.push_back(Projection{kind, std::move(tensors), out});
    }
  }

  Tensor norm(const Tensor& x, const Tensor& weight, double eps) const {
    return exact_ops_ ? at::rms_norm(x, {x.size(1)}, weight, eps) : rms_norm_rows(x, weight, eps);
  }

  // flat: (B, C) float rows of one new position each; keys/values: the layer's (B, Hkv, capacity,
  // D) cache buffers, written at `start`; rotation: (B, 1, D, D) (architectures.py, step_rotation).
  Tensor operator()(const Tensor& flat, const Tensor& rotation, const Tensor& keys, const Tensor& values,
                    int64_t start, const c10::optional<Tensor>& mask) const {
    const int64_t batch = flat.size(0);
    const Tensor heads = projections_[0](norm(flat, input_norm_, input_eps_))
                             .view({batch, -1, 1, head_dim_});  // (B, Hq + 2 Hkv, 1, D)
    const int64_t rotating = num_heads_ + num_kv_heads_;
    const Tensor rotated = at::matmul(heads.narrow(1, 0, rotating), rotation);
    keys.narrow(2, start, 1).copy_(rotated.narrow(1, num_heads_, num_kv_heads_));
    values.narrow(2, start, 1).copy_(heads.narrow(1, rotating, num_kv_heads_));
    const Tensor attended = at::scaled_dot_product_attention(
        rotated.narrow(1, 0, num_heads_), keys.narrow(2, 0, start + 1), values.narrow(2, 0, start + 1), mask,
        /*dropout_p=*/0.0, /*is_causal=*/false, scaling_, /*enable_gqa=*/num_kv_heads_ != num_heads_);
    const Tensor hidden = flat + projections_[1](attended.reshape({batch, -1}));
    const auto gate_up = projections_[2](norm(hidden, post_norm_, post_eps_)).chunk(2, -1);
    return hidden + projections_[3](at::silu(gate_up[0]) * gate_up[1]);
  }

 private:
  Tensor input_norm_, post_norm_;
  double input_eps_, post_eps_, scaling_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  std::vector<Projection> projections_;
  bool exact_ops_ = true;  // every projection on torch's kernels: at::rms_norm, bit for bit the Python step
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  // Every call releases the GIL: the arguments are converted first, and the work is torch's and
  // ours alone, so other request threads (and the server's own) run meanwhile, as they do between
  // the Python step's torch calls.
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  module.def("q4_matmul", &q4_matmul, release(), "(N, K) float32 rows times Q4_1 blocks (qs, d, m): (N, O) float32");
  module.def("lora_b_matmul", &lora_b_matmul, release(), "(N, R) float32 times int8 windows of B^T: (N, O) float32");
  module.def("has_q4_matmul", &has_q4_matmul);
  module.def("q4_from_packed", &q4_from_packed, release(), "torch's packed int4 rows as Q4_1 bytes (learned layout)");
  pybind11::class_<DecodeLayer>(module, "DecodeLayer")
      .def(pybind11::init<Tensor, double, Tensor, double,
                          std::vector<std::tuple<int64_t, std::vector<Tensor>, int64_t>>,
                          double, int64_t, int64_t, int64_t>())
      .def("__call__", &DecodeLayer::operator(), release());
}
