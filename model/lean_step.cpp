// The lean Llama-family layer's decode step (model/architectures.py, LeanLlamaLayer._decode_one)
// as one C++ call over torch's own ops, for low-bit projections on a CPU.
//
// Why: a small model's decode step on a CPU is a few hundred small ops, and at one thread the
// Python interpreter's cost per op call (argument parsing, the Python-side dispatch) is a large
// share of each layer. The same ATen calls in the same order from C++ give the same numbers bit
// for bit (the tests compare with torch.equal) and cost only the dispatcher's share. Built once
// per machine by model/native_step.py; everything else (prefill, float weights, other devices)
// stays on the Python path.
#include <torch/extension.h>

#include <utility>
#include <vector>

namespace {

using at::Tensor;

constexpr int64_t kInt4Group = 32;  // the GGUF Q4_1 block size (model/quantization.py, INT4_GROUP)

// One low-bit projection of (B, in) float rows, exactly as model/quantization.py computes it.
struct Projection {
  int64_t kind;  // 0: int4; 1: int4 with a LoRA (A stacked under the base rows, B in int8); 2: int8
  std::vector<Tensor> tensors;  // 0: packed, scales_and_zeros; 1: + B int8, B scales; 2: int8 rows, scales
  int64_t out;  // output features (1: the base's; the stacked rows add the rank)

  Tensor operator()(const Tensor& x) const {
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
      TORCH_CHECK(kind >= 0 && kind <= 2, "unknown projection kind ", kind);
      TORCH_CHECK(tensors.size() == (kind == 1 ? 4u : 2u), "projection kind ", kind, ": wrong tensor count");
      projections_.push_back(Projection{kind, std::move(tensors), out});
    }
  }

  // flat: (B, C) float rows of one new position each; keys/values: the layer's (B, Hkv, capacity,
  // D) cache buffers, written at `start`; rotation: (B, 1, D, D) (architectures.py, step_rotation).
  Tensor operator()(const Tensor& flat, const Tensor& rotation, const Tensor& keys, const Tensor& values,
                    int64_t start, const c10::optional<Tensor>& mask) const {
    const int64_t batch = flat.size(0);
    const int64_t width = flat.size(1);
    const Tensor heads = projections_[0](at::rms_norm(flat, {width}, input_norm_, input_eps_))
                             .view({batch, -1, 1, head_dim_});  // (B, Hq + 2 Hkv, 1, D)
    const int64_t rotating = num_heads_ + num_kv_heads_;
    const Tensor rotated = at::matmul(heads.narrow(1, 0, rotating), rotation);
    keys.narrow(2, start, 1).copy_(rotated.narrow(1, num_heads_, num_kv_heads_));
    values.narrow(2, start, 1).copy_(heads.narrow(1, rotating, num_kv_heads_));
    const Tensor attended = at::scaled_dot_product_attention(
        rotated.narrow(1, 0, num_heads_), keys.narrow(2, 0, start + 1), values.narrow(2, 0, start + 1), mask,
        /*dropout_p=*/0.0, /*is_causal=*/false, scaling_, /*enable_gqa=*/num_kv_heads_ != num_heads_);
    const Tensor hidden = flat + projections_[1](attended.reshape({batch, -1}));
    const auto gate_up = projections_[2](at::rms_norm(hidden, {width}, post_norm_, post_eps_)).chunk(2, -1);
    return hidden + projections_[3](at::silu(gate_up[0]) * gate_up[1]);
  }

 private:
  Tensor input_norm_, post_norm_;
  double input_eps_, post_eps_, scaling_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  std::vector<Projection> projections_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  pybind11::class_<DecodeLayer>(module, "DecodeLayer")
      .def(pybind11::init<Tensor, double, Tensor, double,
                          std::vector<std::tuple<int64_t, std::vector<Tensor>, int64_t>>,
                          double, int64_t, int64_t, int64_t>())
      .def("__call__", &DecodeLayer::operator());
}
