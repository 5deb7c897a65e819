// The native decode step's kernels for ONE instruction set: lean_step.cpp includes this file twice,
// inside `namespace avx2` under `#pragma GCC target("avx2,fma,...")` with SD_AVX512 0, and inside
// `namespace avx512` under the AVX-512 target with SD_AVX512 1, and picks one set at run time
// (the CPU's own: __builtin_cpu_supports; SKIPDECODE_Q4_ISA forces one). Everything here is
// plain loops over a few vector primitives, so each instruction set gets its own compiled copy.
// A kernel is named by what it does, never by its instruction set: the namespace it is compiled into
// says that (avx2::q4_lane_tile and avx512::q4_lane_tile are the lane kernel on each set, their
// bodies under `#if SD_AVX512` / `#if !SD_AVX512` where the two sets differ).
//
// The q4 matmul: weights as Q4 blocks of 32 (bytes: q[j] low nibble, q[j + 16] high; per block a
// bfloat16 scale and zero, w = (q - 8) scale + zero: torch's int4 values, docs/DESIGN.md), times
// activations quantised per block of 32 to 16-bit integers v = round(x / dx) with
// dx = max|x| / 32639 (relative error ~1e-5: bfloat16 activations are ~2e-3). A block's dot product
// is then exact integer arithmetic, sum_j q_j v_j, times scale dx plus the block's float sum
// times (zero - 8 scale). Both instruction sets compute the SAME integers (AVX2 as 16-bit
// multiply-adds, AVX-512 as v = 256 hi + lo with two signed bytes and VNNI's byte dot products),
// so the two paths differ only in the order of float additions.

// The weights stream from memory once a step (the model is larger than the caches): each group
// asks for the bytes this far ahead of it, so they arrive while the group before them is multiplied.
constexpr int64_t kPrefetchBytes = 4096;
#if SD_AVX512
constexpr int kW = 16;  // floats a vector
using vf = __m512;
static inline vf vzero() { return _mm512_setzero_ps(); }
static inline vf vset(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vabs(vf a) { return _mm512_abs_ps(a); }
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline float vhmax(vf a) { return _mm512_reduce_max_ps(a); }
static inline vf vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
static inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// kW integral floats (|v| < 32768) as int16 codes (the low 16 bits of each int32)
static inline void store_codes(vf integral, int16_t* codes) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(integral)));
}
static inline vf vexp2i(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p * 2^n
static inline bool vany_greater(vf a, float bound) { return _mm512_cmp_ps_mask(a, _mm512_set1_ps(bound), _CMP_GT_OQ) != 0; }
static inline bool vany_nan(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0; }
static inline bool vany_equal(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ) != 0; }
#else
constexpr int kW = 8;
using vf = __m256;
static inline vf vzero() { return _mm256_setzero_ps(); }
static inline vf vset(float x) { return _mm256_set1_ps(x); }
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vabs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline float vsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
static inline float vhmax(vf a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}
static inline vf vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
static inline vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// kW integral floats (|v| < 32768) as int16 codes: the low 16 bits of each int32, as the scalar cast and
// AVX-512's narrowing keep them (so a NaN's code is 0 on every path), not a saturating pack
static inline void store_codes(vf integral, int16_t* codes) {
  const __m256i low = _mm256_and_si256(_mm256_cvtps_epi32(integral), _mm256_set1_epi32(0xFFFF));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes),
                   _mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)));
}
static inline bool vany_greater(vf a, float bound) {
  return _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(bound), _CMP_GT_OQ)) != 0;
}
static inline bool vany_nan(vf a) { return _mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0; }
static inline bool vany_equal(vf a, vf b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)) != 0; }
static inline vf vexp2i(vf p, vf n) {  // p * 2^n for integral n in [-126, 127]
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

static inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// exp(x) (Cephes' expf polynomial after reducing x by multiples of ln 2; ~2 ulp), x clamped to
// [-87, 88]: softmax and SiLU only.
static inline vf vexp(vf x) {
  x = vmax(vset(-87.0f), vmin(x, vset(88.0f)));
  const vf n = vround(vmul(x, vset(1.44269504088896341f)));
  vf r = vfma(n, vset(-0.693359375f), x);
  r = vfma(n, vset(2.12194440e-4f), r);
  vf p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(vmul(p, r), r, vadd(r, vset(1.0f)));
  return vexp2i(p, n);
}

// --- small row operations --------------------------------------------------------------------

static inline float dot(const float* a, const float* b, int64_t n) {
  vf acc = vzero();
  int64_t j = 0;
  for (; j + kW <= n; j += kW) acc = vfma(vload(a + j), vload(b + j), acc);
  float total = vsum(acc);
  for (; j < n; ++j) total += a[j] * b[j];
  return total;
}

// The index of a row's largest value, the first where several are equal, and the first NaN where there
// is one: torch's argmax (its CPU kernel took ~120 us for a 49152-entry row, a step's 2-3%).
static int64_t row_argmax(const float* x, int64_t n) {
  vf best = vset(-INFINITY);
  bool nan = false;
  int64_t j = 0;
  for (; j + kW <= n; j += kW) {
    const vf v = vload(x + j);
    nan = nan || vany_nan(v);
    best = vmax(best, v);
  }
  float largest = vhmax(best);
  for (; j < n; ++j) {
    nan = nan || std::isnan(x[j]);
    largest = std::max(largest, x[j]);
  }
  int64_t k = 0;
  if (!nan) {  // whole vectors up to the first that holds the largest value
    const vf target = vset(largest);
    while (k + kW <= n && !vany_equal(vload(x + k), target)) k += kW;
  }
  for (; k < n; ++k) {
    if (nan ? std::isnan(x[k]) : x[k] == largest) return k;
  }
  return 0;  // (unreached: the largest value is in the row)
}

// out = x * rsqrt(mean(x^2) + eps) * weight
static inline void rms_norm_row(const float* x, const float* weight, float eps, int64_t n, float* out) {
  const float mean = dot(x, x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  const vf s = vset(scale);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) vstore(out + j, vmul(vmul(vload(x + j), s), vload(weight + j)));
  for (; j < n; ++j) out[j] = x[j] * scale * weight[j];
}

// out = a + b
static inline void add_rows(const float* a, const float* b, int64_t n, float* out) {
  int64_t j = 0;
  for (; j + kW <= n; j += kW) vstore(out + j, vadd(vload(a + j), vload(b + j)));
  for (; j < n; ++j) out[j] = a[j] + b[j];
}

// out = silu(gate) * up
static inline void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const vf one = vset(1.0f);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) {
    const vf g = vload(gate + j);
    vstore(out + j, vmul(vdiv(g, vadd(one, vexp(vsub(vzero(), g)))), vload(up + j)));
  }
  for (; j < n; ++j) out[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
}

// The Llama rotary of one head in place: x * cos + rotate_half(x) * sin, rotate_half(x) =
// (-x[D/2:], x[:D/2]).
static inline void rotate_head(float* x, const float* cos, const float* sin, int64_t size) {
  const int64_t half = size / 2;
  float rotated[512];
  for (int64_t j = 0; j < half; ++j) {
    rotated[j] = x[j] * cos[j] - x[j + half] * sin[j];
    rotated[j + half] = x[j + half] * cos[j + half] + x[j] * sin[j + half];
  }
  std::memcpy(x, rotated, sizeof(float) * size);
}

// Attention of `group` query heads (q: group x D, contiguous) that share one key/value head over
// `length` cached positions (keys, values: length x D), the earlier keys where allowed[j] (nullptr:
// all; the last key, the step's own position, always);
// out: group x D. scores: scratch of group * length floats.
static void attend(const float* q, int64_t group, const float* keys, const float* values, int64_t length,
                   int64_t size, float scaling, const bool* allowed, float* scores, float* out) {
  for (int64_t h = 0; h < group; ++h) {
    float* s = scores + h * length;
    const float* qh = q + h * size;
    float largest = -INFINITY;
    for (int64_t j = 0; j < length; ++j) {
      if (allowed != nullptr && j + 1 < length && !allowed[j]) {
        s[j] = -INFINITY;
        continue;
      }
      s[j] = dot(qh, keys + j * size, size) * scaling;
      largest = std::max(largest, s[j]);
    }
    const vf top = vset(largest);
    vf total = vzero();
    int64_t j = 0;
    for (; j + kW <= length; j += kW) {
      const vf p = vexp(vsub(vload(s + j), top));
      vstore(s + j, p);
      total = vadd(total, p);
    }
    float sum = vsum(total);
    for (; j < length; ++j) {
      s[j] = std::exp(s[j] - largest);
      sum += s[j];
    }
    if (allowed != nullptr) {  // exp(-inf - top) may not be exactly 0 after the clamp: masked keys weigh 0
      for (int64_t k = 0; k < length; ++k) {
        if (k + 1 < length && !allowed[k]) {
          sum -= s[k];
          s[k] = 0.0f;
        }
      }
    }
    const float inverse = 1.0f / sum;
    float* o = out + h * size;
    // The weighted values, kChunk vectors of the output at a time held in registers across the keys
    // (through memory each key's sums had waited on the last key's stores); the same operations in
    // the same order, so the same floats.
    constexpr int kChunk = 4;
    int64_t d = 0;
    for (; d + kW <= size; d += kChunk * kW) {
      const int vectors = static_cast<int>(std::min<int64_t>(kChunk, (size - d) / kW));
      vf acc[kChunk] = {vzero(), vzero(), vzero(), vzero()};
      for (int64_t k = 0; k < length; ++k) {
        const float weight = s[k] * inverse;
        if (weight == 0.0f) continue;
        const vf w = vset(weight);
        const float* v = values + k * size + d;
        if (vectors == kChunk) {
          for (int i = 0; i < kChunk; ++i) acc[i] = vfma(w, vload(v + i * kW), acc[i]);
        } else {
          for (int i = 0; i < vectors; ++i) acc[i] = vfma(w, vload(v + i * kW), acc[i]);
        }
      }
      for (int i = 0; i < vectors; ++i) vstore(o + d + i * kW, acc[i]);
    }
    d = size / kW * kW;
    for (int64_t t = d; t < size; ++t) o[t] = 0.0f;
    for (int64_t k = 0; k < length && d < size; ++k) {
      const float weight = s[k] * inverse;
      if (weight == 0.0f) continue;
      const float* v = values + k * size;
      for (int64_t t = d; t < size; ++t) o[t] += weight * v[t];
    }
  }
}

// --- activations quantised for the q4 matmul ---------------------------------------------------
//
// Rows of x in blocks of 32, padded with zero blocks to a multiple of 4 (a group), laid out group
// by group (all rows of group 0, then of group 1...: a kernel pass over a group reads every row's
// slice at fixed offsets from one pointer). Per row and group:
//   dx[4]: each block's scale; fix[8]: per block -8 * sum(x), sum(x) — dotted with the weights'
//   (scale, zero) pairs they give sum_b (zero - 8 scale) sum_b;
//   AVX2: codes[128] (int16, natural order); AVX-512: split[256]: hi of the four blocks' elements
//   0-15, hi of 16-31, lo of 0-15, lo of 16-31 (v = 256 hi + lo), and scales16[16]: each block's dx
//   repeated 4 times (VNNI's dot product lanes: 4 bytes each).
//
// AVX-512 also lays the row's first 16 * (blocks / 16) blocks out "a block per lane" for the lane
// kernel (q4_lane_tile, below): per row and superblock of 16 blocks, lanes[1024] bytes: for chunk c
// (0-3) four 64-byte vectors, hi of elements 4c..4c+3 of each block, hi of 16 + 4c.., lo of 4c..,
// lo of 16 + 4c.. (lane l: block l's 4 bytes), and lane_f[48]: each block's dx, sum, -8 sum.
// AVX2 lays the first 8 * (blocks / 8) blocks out for its own lane kernel (q4_lane_tile): per row
// and superblock of 8 blocks, lanes16[256] int16: for chunk c (0-7) two 16-lane vectors, elements 2c,
// 2c + 1 of each block, then elements 16 + 2c, 16 + 2c + 1 (lanes 2l, 2l + 1: block l's pair), and
// lane_f[24]: each block's dx, sum, -8 sum.
constexpr int64_t kLaneBlocks = SD_AVX512 ? 16 : 8;  // blocks a lane kernel's superblock holds (a block a 32-bit lane)

struct QuantRows {
  int64_t rows = 0, blocks = 0, groups = 0, supers = 0;
  int16_t* codes = nullptr;   // groups x rows x 128
  int8_t* split = nullptr;    // groups x rows x 256
  float* dx = nullptr;        // groups x rows x 4
  float* scales16 = nullptr;  // groups x rows x 16
  float* fix = nullptr;       // groups x rows x 8
  int8_t* lanes = nullptr;    // supers x rows x 1024 (AVX-512)
  int16_t* lanes16 = nullptr;  // supers x rows x 256 (AVX2)
  float* lane_f = nullptr;    // supers x rows x 48 (AVX-512), x 24 (AVX2)
};

static inline int64_t quant_floats(int64_t rows, int64_t width) {  // scratch floats QuantRows needs (either set's)
  const int64_t groups = (width / 32 + 3) / 4, blocks = width / 32;
  return rows * groups * (64 + 64 + 4 + 16 + 8) +
         std::max(rows * (blocks / 16) * (256 + 48), rows * (blocks / 8) * (128 + 24)) + 64;
}

// One block of 32: its int16 codes, scale and float sum (zeros past the row's last block).
static inline void quantize_block(const float* v, bool present, int16_t* codes, float* scale, float* sum) {
  float largest = 0.f, total = 0.f;
  if (present) {
    vf big = vzero(), acc = vzero();
    for (int j = 0; j < 32; j += kW) {
      const vf xv = vload(v + j);
      big = vmax(big, vabs(xv));
      acc = vadd(acc, xv);
    }
    largest = vhmax(big);
    total = vsum(acc);
  }
  const float inverse = largest > 0.f ? 32639.f / largest : 0.f;
  if (present) {  // round(v inverse) to nearest even, as std::nearbyint did a code at a time (a batch step's ~2%)
    for (int j = 0; j < 32; j += kW) store_codes(vround(vmul(vload(v + j), vset(inverse))), codes + j);
  } else {
    std::memset(codes, 0, 32 * sizeof(int16_t));
  }
  *scale = largest / 32639.f;
  *sum = total;
}

#if SD_AVX512
// Row r's superblock sb (blocks 16 sb .. 16 sb + 15) "a block per lane", from the split bytes
// quantize_rows wrote (their layout above): element e of block l goes to lane l, byte e % 4, of chunk
// (e % 16) / 4, the low-nibble vectors for e < 16 and the high-nibble ones past it (the weights' bytes
// hold q[e] and q[e + 16] in one byte: q4_lanes). Each 64-byte vector is one 4-byte piece of each of
// the 16 blocks, so one gather of 16 dwords from the split bytes writes it (element by element this
// had been most of a decode row's quantisation: 1.7 us of 576 columns, a serial ~8% of a batch-1 step).
static void lane_layout(const QuantRows& q, int64_t sb, int64_t r) {
  int8_t* out = q.lanes + (sb * q.rows + r) * 1024;
  float* f = q.lane_f + (sb * q.rows + r) * 48;
  // block l's split bytes start at dword (4 sb + l / 4) rows 64 + r 64 + (l % 4) 4 (a cell's 256 bytes
  // hold its 4 blocks' hi bytes, elements 0-15 then 16-31, 16 bytes a block, then their lo bytes)
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i blocks = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(lane, 2), _mm512_set1_epi32(static_cast<int>(q.rows * 64))),
                                          _mm512_slli_epi32(_mm512_and_si512(lane, _mm512_set1_epi32(3)), 2));
  const int* split = reinterpret_cast<const int*>(q.split) + ((4 * sb) * q.rows + r) * 64;
  for (int c = 0; c < 4; ++c) {
    for (int half = 0; half < 2; ++half) {
      for (int part = 0; part < 2; ++part) {  // hi bytes, then lo bytes (128 bytes on)
        const __m512i at = _mm512_add_epi32(blocks, _mm512_set1_epi32(part * 32 + half * 16 + c));
        _mm512_storeu_si512(out + c * 256 + part * 128 + half * 64, _mm512_i32gather_epi32(at, split, 4));
      }
    }
  }
  for (int64_t l = 0; l < 16; ++l) {
    const int64_t b = sb * 16 + l, cell = (b / 4) * q.rows + r;
    const float sum = q.fix[cell * 8 + (b % 4) * 2 + 1];
    f[l] = q.dx[cell * 4 + b % 4];
    f[16 + l] = sum;
    f[32 + l] = -8.0f * sum;
  }
}
#endif

#if !SD_AVX512
// Row r's superblock sb (blocks 8 sb .. 8 sb + 7) for the AVX2 lane kernel (the layout above), from the
// codes quantize_rows wrote: element e < 16 of block l goes to chunk e / 2's first vector at lane
// 2l + e % 2, element 16 + e to its second (the weights' byte e holds q[e] and q[e + 16]: q4_lanes_avx2).
static void lane_layout(const QuantRows& q, int64_t sb, int64_t r) {
  int16_t* out = q.lanes16 + (sb * q.rows + r) * 256;
  float* f = q.lane_f + (sb * q.rows + r) * 24;
  for (int64_t l = 0; l < 8; ++l) {
    const int64_t b = sb * 8 + l, cell = (b / 4) * q.rows + r;
    const int16_t* codes = q.codes + cell * 128 + (b % 4) * 32;
    for (int e = 0; e < 16; ++e) {
      out[(e / 2) * 32 + 2 * l + e % 2] = codes[e];
      out[(e / 2) * 32 + 16 + 2 * l + e % 2] = codes[16 + e];
    }
    const float sum = q.fix[cell * 8 + (b % 4) * 2 + 1];
    f[l] = q.dx[cell * 4 + b % 4];
    f[8 + l] = sum;
    f[16 + l] = -8.0f * sum;
  }
}
#endif

static QuantRows quantize_rows(const float* x, int64_t rows, int64_t width, float* scratch) {
  QuantRows q;
  q.rows = rows;
  q.blocks = width / 32;
  q.groups = (q.blocks + 3) / 4;
  const int64_t cells = rows * q.groups;  // (group, row) pairs
  q.codes = reinterpret_cast<int16_t*>(scratch);
  q.split = reinterpret_cast<int8_t*>(scratch + cells * 64);
  q.dx = scratch + cells * 128;
  q.scales16 = q.dx + cells * 4;
  q.fix = q.scales16 + cells * 16;
  q.supers = q.blocks / kLaneBlocks;
#if SD_AVX512
  q.lanes = reinterpret_cast<int8_t*>(q.fix + cells * 8);
  q.lane_f = q.fix + cells * 8 + rows * q.supers * 256;
#else
  q.lanes16 = reinterpret_cast<int16_t*>(q.fix + cells * 8);
  q.lane_f = q.fix + cells * 8 + rows * q.supers * 128;
#endif
  for (int64_t g = 0; g < q.groups; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t cell = g * rows + r;
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t b = g * 4 + k;
        int16_t* codes = q.codes + cell * 128 + k * 32;
        float scale, sum;
        quantize_block(x + r * width + b * 32, b < q.blocks, codes, &scale, &sum);
        q.dx[cell * 4 + k] = scale;
        for (int lane = 0; lane < 4; ++lane) q.scales16[cell * 16 + k * 4 + lane] = scale;
        q.fix[cell * 8 + k * 2] = -8.0f * sum;
        q.fix[cell * 8 + k * 2 + 1] = sum;
#if SD_AVX512
        // hi = floor((v + 128) / 256), lo = v - 256 hi in [-128, 127]: elements 0-15 at split, 16-31
        // 64 bytes on, the lo bytes 128 bytes after the hi ones
        int8_t* split = q.split + cell * 256 + k * 16;
        const __m512i v = _mm512_loadu_si512(codes);
        const __m512i hi = _mm512_srai_epi16(_mm512_add_epi16(v, _mm512_set1_epi16(128)), 8);
        const __m256i hi8 = _mm512_cvtepi16_epi8(hi), lo8 = _mm512_cvtepi16_epi8(_mm512_sub_epi16(v, _mm512_slli_epi16(hi, 8)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(split), _mm256_castsi256_si128(hi8));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(split + 64), _mm256_extracti128_si256(hi8, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(split + 128), _mm256_castsi256_si128(lo8));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(split + 192), _mm256_extracti128_si256(lo8, 1));
#endif
      }
    }
  }
  for (int64_t sb = 0; sb < q.supers; ++sb) {
    for (int64_t r = 0; r < rows; ++r) lane_layout(q, sb, r);
  }
  return q;
}

// --- the q4 matmul: y[r, o] = sum_k x[r, k] w[o, k] for o in [begin, end) ---------------------

struct Q4Weights {
  const uint8_t* qs;   // outputs x blocks * 16
  const uint16_t* sz;  // outputs x blocks x 2 (bfloat16 scale, zero)
  int64_t outputs, blocks;
  // The same bytes in this instruction set's lane layout (lean_step.cpp; AVX-512, q4_lanes: each
  // superblock of 16 blocks as 4 x 64 bytes, lane l holding block l's bytes 4c..4c+3; AVX2,
  // q4_lanes_avx2: each of 8 blocks as 8 x 16 bytes, chunk c holding block l's bytes 2c, 2c + 1 at
  // 2l; the blocks past the last superblock as in qs); nullptr: the group kernel alone.
  const uint8_t* lanes = nullptr;
  // how a lanes tensor of this instruction set's layout is shaped: AVX-512's (O, K/2), AVX2's (O, K/32, 16)
  static constexpr int64_t lane_dims = SD_AVX512 ? 2 : 3;
  // The whole groups of 16 rows laid out for the AMX tiles (amx_kernels.h, amx_layout); nullptr: none
  // (the tiles then transpose the bytes above every time).
  const uint8_t* amx = nullptr;
};

#if SD_AVX512
// R rows of x (from `first`) against O weight rows (from o): each group's weight bytes are unpacked
// once for the R rows and each row's activation bytes loaded once for the O weight rows (loading
// them again for every weight row had left the core waiting on its loads, not its arithmetic).
template <int R, int O, bool Coarse>
static inline void q4_group(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, int64_t g,
                            __m512 (&acc)[R][O]) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i expand = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  const int64_t row_bytes = w.blocks * 16, row_pairs = w.blocks * 2;
  const uint8_t* qs = (w.lanes != nullptr ? w.lanes : w.qs) + o * row_bytes;  // a tail group: the same bytes in both
  const uint16_t* sz = w.sz + o * row_pairs;
  const int64_t present = std::min<int64_t>(4, w.blocks - g * 4);
  const __mmask64 byte_mask = present == 4 ? ~0ULL : (1ULL << (16 * present)) - 1;  // the row's last group
  const __mmask8 pair_mask = static_cast<__mmask8>(present == 4 ? 0xFF : (1U << (2 * present)) - 1);
  __m512i low[O], high[O];
  __m512 scale16[O], scale_zero[O];
  for (int j = 0; j < O; ++j) {
    const uint8_t* bytes_at = qs + j * row_bytes + g * 64;
    _mm_prefetch(reinterpret_cast<const char*>(bytes_at) + kPrefetchBytes, _MM_HINT_T0);
    if (j % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(sz + j * row_pairs + g * 8) + kPrefetchBytes / 4, _MM_HINT_T0);
    const __m512i bytes = _mm512_maskz_loadu_epi8(byte_mask, bytes_at);
    low[j] = _mm512_and_si512(bytes, nibble);
    high[j] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
    const __m128i pairs = _mm_maskz_loadu_epi16(pair_mask, sz + j * row_pairs + g * 8);
    scale_zero[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_zextsi128_si256(pairs)), 16));
    scale16[j] = _mm512_permutexvar_ps(expand, scale_zero[j]);
  }
  const int64_t cell = g * q.rows + first;  // this group's slice of row `first`; row first + r at + r
  for (int r = 0; r < R; ++r) {
    const int8_t* x = q.split + (cell + r) * 256;
    const __m512i hl = _mm512_loadu_si512(x), hh = _mm512_loadu_si512(x + 64);
    const __m512i ll = _mm512_loadu_si512(x + 128), lh = _mm512_loadu_si512(x + 192);
    const __m512 dx16 = _mm512_loadu_ps(q.scales16 + (cell + r) * 16);
    const __m512 fix = _mm512_zextps256_ps512(_mm256_loadu_ps(q.fix + (cell + r) * 8));
    for (int j = 0; j < O; ++j) {
      __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low[j], hl);
      t = _mm512_dpbusd_epi32(t, high[j], hh);
      t = _mm512_slli_epi32(t, 8);
      if (!Coarse) {  // Coarse: the high bytes alone, activations at 8 bits (the head's scan)
        t = _mm512_dpbusd_epi32(t, low[j], ll);
        t = _mm512_dpbusd_epi32(t, high[j], lh);
      }
      acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(scale16[j], dx16), acc[r][j]);
      acc[r][j] = _mm512_fmadd_ps(scale_zero[j], fix, acc[r][j]);  // lanes 0-7: sum_b (zero - 8 scale) sum_b
    }
  }
}

// R rows of x (from `first`) against O weight rows (from o), four blocks a group (the lanes of a
// vector: four per block): each group's weight bytes are unpacked once for the R rows and each
// row's activation bytes loaded once for the O weight rows (loading them again for every weight row
// had left the core waiting on its loads, not its arithmetic).
template <int R, int O, bool Coarse>
static inline void q4_tile(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, float* y,
                           int64_t y_stride) {
  __m512 acc[R][O];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < O; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < q.groups; ++g) q4_group<R, O, Coarse>(w, q, first, o, g, acc);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < O; ++j) y[(first + r) * y_stride + o + j] = _mm512_reduce_add_ps(acc[r][j]);
  }
}

// The lane kernel: the same integers as q4_tile, with SIXTEEN blocks a vector, one a lane. Why: a
// block's integer dot product must be scaled by its own weight scale times its own activation dx
// before blocks are added, and q4_tile spends a convert, a multiply and two FMAs on that for every
// 4 blocks of every (row, weight row) pair, beside its 4 VNNI instructions: more than half its
// arithmetic. Here a lane accumulates all 32 products of its block over 8 VNNI steps (16 with the
// 16-bit activations' high and low bytes: the int32 sums stay below 2^24), so the scaling is paid
// once per 16 blocks: 16 VNNI + 7 other instructions per pair and 512 weights, against 36 + 9 in
// q4_tile. Register tile: R rows x O weight rows; each 64-byte chunk of weights is unpacked once for
// the R rows, each row's activation vectors loaded once for the O weight rows; the integer sums
// (R x O x 2 vectors) live across a superblock's 4 chunks. The tail past the last superblock (576
// columns = 16 + 2 blocks) runs q4_group's code on the same bytes.
template <int R, int O, bool Coarse>
static inline void q4_lane_tile(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, float* y,
                                int64_t y_stride) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i zero_bits = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t row_bytes = w.blocks * 16, row_pairs = w.blocks * 2;
  __m512 acc[R][O];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < O; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t sb = 0; sb < q.supers; ++sb) {
    __m512i hi_sum[R][O], lo_sum[R][O];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < O; ++j) hi_sum[r][j] = lo_sum[r][j] = _mm512_setzero_si512();
    }
    for (int c = 0; c < 4; ++c) {
      __m512i low[O], high[O];
      for (int j = 0; j < O; ++j) {
        const uint8_t* bytes_at = w.lanes + (o + j) * row_bytes + sb * 256 + c * 64;
        _mm_prefetch(reinterpret_cast<const char*>(bytes_at) + kPrefetchBytes, _MM_HINT_T0);
        const __m512i bytes = _mm512_loadu_si512(bytes_at);
        low[j] = _mm512_and_si512(bytes, nibble);  // lane l: q[4c .. 4c + 3] of block l
        high[j] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);  // q[16 + 4c ..]
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* x = q.lanes + (sb * q.rows + first + r) * 1024 + c * 256;
        const __m512i hl = _mm512_loadu_si512(x), hh = _mm512_loadu_si512(x + 64);
        for (int j = 0; j < O; ++j) {
          hi_sum[r][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(hi_sum[r][j], low[j], hl), high[j], hh);
        }
        if (!Coarse) {  // Coarse: the high bytes alone, activations at 8 bits (the head's scan)
          const __m512i ll = _mm512_loadu_si512(x + 128), lh = _mm512_loadu_si512(x + 192);
          for (int j = 0; j < O; ++j) {
            lo_sum[r][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(lo_sum[r][j], low[j], ll), high[j], lh);
          }
        }
      }
    }
    // per lane (block): scale dx (256 hi + lo) + (zero - 8 scale) sum, as q4_group
    for (int j = 0; j < O; ++j) {
      const uint16_t* pairs_at = w.sz + (o + j) * row_pairs + sb * 32;
      _mm_prefetch(reinterpret_cast<const char*>(pairs_at) + kPrefetchBytes / 4, _MM_HINT_T0);
      const __m512i pairs = _mm512_loadu_si512(pairs_at);  // lane l: block l's (scale, zero) bfloat16
      const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      const __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(pairs, zero_bits));
      for (int r = 0; r < R; ++r) {
        const float* f = q.lane_f + (sb * q.rows + first + r) * 48;
        const __m512i whole = _mm512_add_epi32(_mm512_slli_epi32(hi_sum[r][j], 8), lo_sum[r][j]);
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(whole), _mm512_mul_ps(scale, _mm512_loadu_ps(f)), acc[r][j]);
        acc[r][j] = _mm512_fmadd_ps(zero, _mm512_loadu_ps(f + 16), acc[r][j]);
        acc[r][j] = _mm512_fmadd_ps(scale, _mm512_loadu_ps(f + 32), acc[r][j]);
      }
    }
  }
  for (int64_t g = q.supers * 4; g < q.groups; ++g) q4_group<R, O, Coarse>(w, q, first, o, g, acc);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < O; ++j) y[(first + r) * y_stride + o + j] = _mm512_reduce_add_ps(acc[r][j]);
  }
}

// Rows [first, first + R) of q against weight rows [o, o + O): the lane kernel where the weights
// have the lane layout, else the group kernel.
template <int R, int O, bool Coarse>
static inline void q4_tile_any(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, float* y,
                               int64_t y_stride) {
  if (w.lanes != nullptr && q.supers > 0) {
    q4_lane_tile<R, O, Coarse>(w, q, first, o, y, y_stride);
  } else {
    q4_tile<R, O, Coarse>(w, q, first, o, y, y_stride);
  }
}

// Rows [first, last) of q against O weight rows from o: tiles of 4 rows, then the 1-3 rows left.
template <int O, bool Coarse>
static inline void q4_column(const Q4Weights& w, const QuantRows& q, float* y, int64_t y_stride, int64_t o,
                             int64_t first, int64_t last) {
  for (; first + 4 <= last; first += 4) q4_tile_any<4, O, Coarse>(w, q, first, o, y, y_stride);
  switch (last - first) {
    case 3: q4_tile_any<3, O, Coarse>(w, q, first, o, y, y_stride); break;
    case 2: q4_tile_any<2, O, Coarse>(w, q, first, o, y, y_stride); break;
    case 1: q4_tile_any<1, O, Coarse>(w, q, first, o, y, y_stride); break;
    default: break;
  }
}

// Every row of q against weight rows [begin, end), tile by tile (the threads split the weight rows:
// each thread streams its own share of the weights once, for every row of the batch or prompt).
// A decode step's one row takes four weight rows at a time (more independent sums in flight); a
// batch's rows four at a time against two (the register file holds 4 x 2 x 2 integer sums).
// A prompt's rows go in blocks of kRowBlock: a block's activations (16 rows x 576 columns x 2 bytes)
// stay in L1 while the thread's weight rows pass over them, and the weights (the thread's share of
// one matrix, in L2) are read again once per block; all rows at once had streamed every row's
// activations from L2 for each pair of weight rows.
constexpr int64_t kRowBlock = 16;

template <bool Coarse>
static void q4_tiles(const Q4Weights& w, const QuantRows& q, float* y, int64_t y_stride, int64_t begin, int64_t end) {
  if (q.rows == 1) {
    int64_t o = begin;
    for (; o + 3 < end; o += 4) q4_tile_any<1, 4, Coarse>(w, q, 0, o, y, y_stride);
    for (; o < end; ++o) q4_tile_any<1, 1, Coarse>(w, q, 0, o, y, y_stride);
    return;
  }
  for (int64_t first = 0; first < q.rows; first += kRowBlock) {
    const int64_t last = std::min(q.rows, first + kRowBlock);
    int64_t o = begin;
    for (; o + 1 < end; o += 2) q4_column<2, Coarse>(w, q, y, y_stride, o, first, last);
    for (; o < end; ++o) q4_column<1, Coarse>(w, q, y, y_stride, o, first, last);
  }
}

// coarse: activations at 8 bits (v's high byte) where only a ranking is asked for (the two-stage
// head's scan: its 4-bit weights err ~10x more than 8-bit activations); AVX2 always computes all 16.
static void q4_rows(const Q4Weights& w, const QuantRows& q, float* y, int64_t y_stride, int64_t begin, int64_t end,
                    bool coarse = false) {
  if (coarse) {
    q4_tiles<true>(w, q, y, y_stride, begin, end);
  } else {
    q4_tiles<false>(w, q, y, y_stride, begin, end);
  }
}
#else
// 16 Q4 bytes widened once to 16-bit lanes (each q[j] | q[j + 16] << 4): the low nibbles by a mask, the
// high ones by a shift (a block's: q[0..15] and q[16..31]; a lane chunk's: see q4_lane_tile).
static inline void widen_q4_block(const uint8_t* bytes, __m256i& low, __m256i& high) {
  const __m256i both = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  low = _mm256_and_si256(both, _mm256_set1_epi16(0x0F));
  high = _mm256_srli_epi16(both, 4);
}

// acc + the block's integer dot product with a row's 32 codes times the weight scale times the row's dx.
static inline __m256 q4_block_fma(__m256i low, __m256i high, const int16_t* codes, __m256 weight_scale, const float* dx,
                                  __m256 acc) {
  const __m256i dot = _mm256_add_epi32(
      _mm256_madd_epi16(low, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes))),
      _mm256_madd_epi16(high, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 16))));
  return _mm256_fmadd_ps(_mm256_mul_ps(weight_scale, _mm256_broadcast_ss(dx)), _mm256_cvtepi32_ps(dot), acc);
}

// Four blocks' bfloat16 (scale, zero) pairs as floats, for the zero terms' dot with (-8 sum, sum).
static inline __m256 q4_pair_floats(__m128i pairs) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(pairs), 16));
}

// R rows of x (from `first`) against weight row o (the kernel without the lane layout).
template <int R>
static inline void q4_row(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, float* y,
                          int64_t y_stride) {
  const uint8_t* qs = w.qs + o * w.blocks * 16;
  const uint16_t* sz = w.sz + o * w.blocks * 2;
  // Two accumulators a row (even and odd blocks): one fused multiply-add chain would wait on its
  // own latency at every block.
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  const auto block = [&](int64_t b, __m256* acc) {
    __m256i low, high;
    widen_q4_block(qs + b * 16, low, high);
    const __m256 weight_scale = _mm256_set1_ps(bf16_to_float(sz[2 * b]));
    const int64_t cell = (b / 4) * q.rows + first;  // row first + r: + r
    const int16_t* xb = q.codes + cell * 128 + (b % 4) * 32;
    const float* dx = q.dx + cell * 4 + b % 4;
    for (int r = 0; r < R; ++r) acc[r] = q4_block_fma(low, high, xb + r * 128, weight_scale, dx + r * 4, acc[r]);
  };
  int64_t b = 0;
  for (; b + 1 < w.blocks; b += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(qs + b * 16) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sz + b * 2) + kPrefetchBytes / 4, _MM_HINT_T0);
    block(b, even);
    block(b + 1, odd);
  }
  if (b < w.blocks) block(b, even);
  // sum over blocks of (zero - 8 scale) times the block's float sum: four blocks a vector, the
  // row's last partial group one block at a time (no read past the row's end)
  __m256 fix[R];
  float tail[R];
  for (int r = 0; r < R; ++r) {
    fix[r] = _mm256_setzero_ps();
    tail[r] = 0.f;
  }
  int64_t g = 0;
  for (; (g + 1) * 4 <= w.blocks; ++g) {
    const __m256 scale_zero = q4_pair_floats(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sz + g * 8)));
    const float* fx = q.fix + (g * q.rows + first) * 8;
    for (int r = 0; r < R; ++r) fix[r] = _mm256_fmadd_ps(scale_zero, _mm256_loadu_ps(fx + r * 8), fix[r]);
  }
  for (int64_t b = g * 4; b < w.blocks; ++b) {
    const float scale = bf16_to_float(sz[2 * b]), zero = bf16_to_float(sz[2 * b + 1]);
    const float* fx = q.fix + (g * q.rows + first) * 8 + (b % 4) * 2;
    for (int r = 0; r < R; ++r) tail[r] += scale * fx[r * 8] + zero * fx[r * 8 + 1];
  }
  for (int r = 0; r < R; ++r) {
    y[(first + r) * y_stride + o] = vsum(_mm256_add_ps(_mm256_add_ps(even[r], odd[r]), fix[r])) + tail[r];
  }
}

// The blocks past the last superblock of 8 (576 columns: 2 of 18) for the AVX2 lane kernel's R x O tile,
// added into its accumulators: each block's integer dot product times its weight scale times its dx
// (q4_block_fma, as q4_row), and the zero terms of each group of 4 (the group's absent blocks: zero pairs, zero sums).
// Their bytes are read from the lanes copy, where they lie as in qs. They had run as q4_row over the tail,
// one call per weight row: its loops, scalar zero terms and horizontal sum cost a 576-wide matrix ~a
// quarter of its time on a Zen 3 core (the whole decode step's tail ~20% of its samples, perf), and its
// reads of qs fetched a second array's line per weight row.
template <int R, int O>
static inline void q4_lane_tail(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, __m256 (&acc)[R][O]) {
  const int64_t row_bytes = w.blocks * 16, row_pairs = w.blocks * 2;
  for (int64_t b = q.supers * 8; b < w.blocks; ++b) {
    const int64_t cell = (b / 4) * q.rows + first;  // row first + r: + r
    const int16_t* xb = q.codes + cell * 128 + (b % 4) * 32;
    const float* dx = q.dx + cell * 4 + b % 4;
    for (int j = 0; j < O; ++j) {
      __m256i low, high;
      widen_q4_block(w.lanes + (o + j) * row_bytes + b * 16, low, high);
      const __m256 weight_scale = _mm256_set1_ps(bf16_to_float(w.sz[(o + j) * row_pairs + 2 * b]));
      for (int r = 0; r < R; ++r) acc[r][j] = q4_block_fma(low, high, xb + r * 128, weight_scale, dx + r * 4, acc[r][j]);
    }
  }
  for (int64_t g = q.supers * 2; g < q.groups; ++g) {  // (scale, zero) pairs . (-8 sum, sum) a block
    const __m128i present = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(w.blocks - g * 4)), _mm_setr_epi32(0, 1, 2, 3));
    for (int j = 0; j < O; ++j) {
      const __m128i pairs = _mm_maskload_epi32(reinterpret_cast<const int*>(w.sz + (o + j) * row_pairs + g * 8), present);
      const __m256 scale_zero = q4_pair_floats(pairs);
      for (int r = 0; r < R; ++r) {
        acc[r][j] = _mm256_fmadd_ps(scale_zero, _mm256_loadu_ps(q.fix + (g * q.rows + first + r) * 8), acc[r][j]);
      }
    }
  }
}

// The AVX2 lane kernel: the same integers as q4_row, with EIGHT blocks a vector, one a 32-bit lane, so
// that a block's scaling (its weight scale times its activation dx, and the zero term) is paid once
// per 8 blocks instead of once a block: q4_row spends a broadcast, a multiply, a convert and an FMA a
// block and row beside its two 16-bit multiply-adds. vpmaddwd multiplies 16-bit lanes in pairs and
// adds each pair into its 32-bit lane, so lane l takes a pair of block l's elements a chunk (the
// weights' byte e holds q[e] and q[e + 16]: one 16-byte load widened to 16-bit lanes gives, by a mask
// and a shift, the low and the high elements of a chunk for all 8 blocks). A lane's sum of 32
// products stays below 2^24. Register tile: R rows x O weight rows; each chunk's weights are widened
// once for the R rows, each row's activation vectors loaded once for the O weight rows. The blocks
// past the last superblock: q4_lane_tail, into the same accumulators.
template <int R, int O>
static inline void q4_lane_tile(const Q4Weights& w, const QuantRows& q, int64_t first, int64_t o, float* y,
                                int64_t y_stride) {
  const __m256i zero_bits = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t row_bytes = w.blocks * 16, row_pairs = w.blocks * 2;
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < O; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t sb = 0; sb < q.supers; ++sb) {
    __m256i sums[R][O];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < O; ++j) sums[r][j] = _mm256_setzero_si256();
    }
    // the superblock's bytes of each weight row and activations of each row, addressed once (inside the
    // chunk loop GCC had recomputed every row's address from q, a multiply and four adds a row and chunk)
    const uint8_t* bytes[O];
    for (int j = 0; j < O; ++j) bytes[j] = w.lanes + (o + j) * row_bytes + sb * 128;
    const int16_t* xs = q.lanes16 + (sb * q.rows + first) * 256;  // row first + r: + r 256
    for (int c = 0; c < 8; ++c) {
      __m256i low[O], high[O];
      for (int j = 0; j < O; ++j) {
        const uint8_t* bytes_at = bytes[j] + c * 16;
        if (c % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(bytes_at) + kPrefetchBytes, _MM_HINT_T0);
        // low: lanes 2l, 2l + 1 hold q[2c], q[2c + 1] of block l; high: q[16 + 2c], q[16 + 2c + 1]
        widen_q4_block(bytes_at, low[j], high[j]);
      }
      for (int r = 0; r < R; ++r) {
        const int16_t* x = xs + r * 256 + c * 32;
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
        // one product at a time into the sum (integers: any order is the same sum): one register of
        // temporaries, so a 4 x 2 tile's eight sums, four weight vectors and two activation vectors fit
        // AVX2's sixteen (two temporaries had spilled half the sums to the stack every chunk)
        for (int j = 0; j < O; ++j) sums[r][j] = _mm256_add_epi32(sums[r][j], _mm256_madd_epi16(low[j], xl));
        for (int j = 0; j < O; ++j) sums[r][j] = _mm256_add_epi32(sums[r][j], _mm256_madd_epi16(high[j], xh));
      }
    }
    // per lane (block): scale dx sum_j q_j v_j + zero sum + scale (-8 sum), as q4_row
    for (int j = 0; j < O; ++j) {
      const uint16_t* pairs_at = w.sz + (o + j) * row_pairs + sb * 16;
      // the pairs stream beside the bytes, a quarter as fast: asked for as far ahead in time (without
      // it the core waited on them: 1.08x / 1.10x a 576- / 1536-wide matrix on a Zen 3 core)
      _mm_prefetch(reinterpret_cast<const char*>(pairs_at) + kPrefetchBytes / 4, _MM_HINT_T0);
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs_at));  // lane l: block l's pair
      const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
      const __m256 zero = _mm256_castsi256_ps(_mm256_and_si256(pairs, zero_bits));
      for (int r = 0; r < R; ++r) {
        const float* f = q.lane_f + (sb * q.rows + first + r) * 24;
        acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][j]), _mm256_mul_ps(scale, _mm256_loadu_ps(f)), acc[r][j]);
        acc[r][j] = _mm256_fmadd_ps(zero, _mm256_loadu_ps(f + 8), acc[r][j]);
        acc[r][j] = _mm256_fmadd_ps(scale, _mm256_loadu_ps(f + 16), acc[r][j]);
      }
    }
  }
  if (q.supers * 8 < w.blocks) q4_lane_tail<R, O>(w, q, first, o, acc);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < O; ++j) y[(first + r) * y_stride + o + j] = vsum(acc[r][j]);
  }
}

// Rows [first, last) of q against O weight rows from o on the lane kernel: tiles of 4 rows, then the
// 1-3 rows left.
template <int O>
static inline void q4_column(const Q4Weights& w, const QuantRows& q, float* y, int64_t y_stride, int64_t o,
                             int64_t first, int64_t last) {
  for (; first + 4 <= last; first += 4) q4_lane_tile<4, O>(w, q, first, o, y, y_stride);
  switch (last - first) {
    case 3: q4_lane_tile<3, O>(w, q, first, o, y, y_stride); break;
    case 2: q4_lane_tile<2, O>(w, q, first, o, y, y_stride); break;
    case 1: q4_lane_tile<1, O>(w, q, first, o, y, y_stride); break;
    default: break;
  }
}

// Every row of q against weight rows [begin, end). With the lane layout: a decode step's one row
// against four weight rows at a time, a batch's rows four at a time against two (the 16 registers
// hold 4 x 2 integer sums, the widened weights and a row's activations), a prompt's rows in blocks of
// 16 (as the AVX-512 kernels: a block's activations stay in L1 while the weight rows pass). Without
// it: four rows of x at a time against each weight row (its bytes unpacked once for all of them).
constexpr int64_t kRowBlock = 16;

static void q4_rows(const Q4Weights& w, const QuantRows& q, float* y, int64_t y_stride, int64_t begin, int64_t end,
                    bool /*coarse*/ = false) {
  if (w.lanes != nullptr && q.supers > 0) {
    if (q.rows == 1) {
      int64_t o = begin;
      for (; o + 3 < end; o += 4) q4_lane_tile<1, 4>(w, q, 0, o, y, y_stride);
      for (; o < end; ++o) q4_lane_tile<1, 1>(w, q, 0, o, y, y_stride);
      return;
    }
    for (int64_t first = 0; first < q.rows; first += kRowBlock) {
      const int64_t last = std::min(q.rows, first + kRowBlock);
      int64_t o = begin;
      for (; o + 1 < end; o += 2) q4_column<2>(w, q, y, y_stride, o, first, last);
      for (; o < end; ++o) q4_column<1>(w, q, y, y_stride, o, first, last);
    }
    return;
  }
  for (int64_t o = begin; o < end; ++o) {
    int64_t first = 0;
    for (; first + 4 <= q.rows; first += 4) q4_row<4>(w, q, first, o, y, y_stride);
    switch (q.rows - first) {
      case 3: q4_row<3>(w, q, first, o, y, y_stride); break;
      case 2: q4_row<2>(w, q, first, o, y, y_stride); break;
      case 1: q4_row<1>(w, q, first, o, y, y_stride); break;
      default: break;
    }
  }
}
#endif

// The multiply-add peak of this instruction set's q4 arithmetic, for the bench's shares (no loads,
// 12 independent chains: more than the instructions' latency times their throughput): `reps` rounds,
// returns the multiply-adds done (AVX-512 VNNI: vpdpbusd, 64 byte products an instruction; AVX2:
// vpmaddwd, 16 products of 16-bit lanes). *sink keeps the sums alive.
static int64_t peak_multiply_adds(int64_t reps, int32_t* sink) {
#if SD_AVX512
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5), acc[12];
  asm volatile("" : "+v"(a), "+v"(b));  // not constants: nothing to fold
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int64_t r = 0; r < reps; ++r) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm512_add_epi32(total, acc[i]);
  *sink += _mm512_reduce_add_epi32(total);
  return reps * 12 * 64;
#else
  __m256i a = _mm256_set1_epi16(3), b = _mm256_set1_epi16(5), acc[12];
  asm volatile("" : "+x"(a), "+x"(b));
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  for (int64_t r = 0; r < reps; ++r) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(a, b));
  }
  __m256i total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm256_add_epi32(total, acc[i]);
  int32_t lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), total);
  for (int i = 0; i < 8; ++i) *sink += lanes[i];
  return reps * 12 * 16;
#endif
}

// y[r, o] += scale[o] * sum_j window[o, j] * a[r, start[o] + j] for o in [begin, end): a LoRA's B
// as int8 windows of its block-diagonal rows (model/lowbit/native_kernels.py, lora_b_windows).
static void lora_b_rows(const float* a, int64_t a_stride, int64_t rows, const int8_t* window, int64_t width,
                        const int32_t* start, const float* scale, float* y, int64_t y_stride, int64_t begin,
                        int64_t end) {
  float weights[256];  // the window in float, converted once for every row (widths beyond: in pieces)
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t piece = 0; piece < width; piece += 256) {
      const int64_t span = std::min<int64_t>(256, width - piece);
      for (int64_t j = 0; j < span; ++j) weights[j] = static_cast<float>(window[o * width + piece + j]);
      for (int64_t r = 0; r < rows; ++r) {
        y[r * y_stride + o] += dot(weights, a + r * a_stride + start[o] + piece, span) * scale[o];
      }
    }
  }
}

#if !SD_AVX512
// AVX2: y[r, o] += scale[o] * sum_j B[o, j] a[r, j] a tile of 16 outputs at a time, in float, from the
// tiles' layout lora_b_layout builds (per tile, columns [tile_start, + TW) of its 16 outputs, for each 4
// columns (16, 4) bytes: an output's 4 side by side). lora_b_rows had taken one output and row at a time:
// the window converted to float per output, a dot product and its horizontal sum per row, ~3 G
// multiply-adds/s on a Zen 3 core (the LoRA's B ~12% of a SkipDecode step at batch 8). Here 8 bytes (2
// outputs x 4 columns) widen to one vector, times the row's 4 columns repeated twice, each lane summing
// one (output, column mod 4) over the window; three horizontal adds a half-tile give its 8 outputs.
// Rows two at a time against a half-tile (8 accumulators); a row's sums never depend on its neighbours.
template <int R>
static inline void lora_b_half_tile(const float* a, int64_t a_stride, int64_t first, const int8_t* tile,
                                    int64_t tile_width, int32_t start, const float* scale, float* y,
                                    int64_t y_stride, int64_t o) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < 4; ++k) acc[r][k] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < tile_width / 4; ++i) {
    const int8_t* bytes = tile + i * 64;  // outputs 0-7 of this half, 4 columns each
    __m256 w[4];
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * k))));
    }
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(a + (first + r) * a_stride + start + 4 * i));
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm256_fmadd_ps(w[k], x, acc[r][k]);
    }
  }
  // acc[k]: outputs 2k (lanes 0-3) and 2k + 1 (lanes 4-7), a lane per column mod 4
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // (0, 2, 4, 6 | 1, 3, 5, 7) -> 0..7
  const __m256 scales = _mm256_loadu_ps(scale + o);
  for (int r = 0; r < R; ++r) {
    const __m256 sums = _mm256_permutevar8x32_ps(
        _mm256_hadd_ps(_mm256_hadd_ps(acc[r][0], acc[r][1]), _mm256_hadd_ps(acc[r][2], acc[r][3])), order);
    float* out = y + (first + r) * y_stride + o;
    _mm256_storeu_ps(out, _mm256_fmadd_ps(sums, scales, _mm256_loadu_ps(out)));
  }
}

static void lora_b_tiles(const float* a, int64_t a_stride, int64_t rows, const int8_t* tiles, int64_t tile_width,
                         const int32_t* tile_start, const float* scale, float* y, int64_t y_stride, int64_t begin,
                         int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    for (int half = 0; half < 2; ++half) {
      const int8_t* tile = tiles + t * tile_width * 16 + half * 32;  // (TW / 4, 16, 4): this half's 8 outputs
      const int64_t o = t * 16 + half * 8;
      int64_t first = 0;
      for (; first + 2 <= rows; first += 2) {
        lora_b_half_tile<2>(a, a_stride, first, tile, tile_width, tile_start[t], scale, y, y_stride, o);
      }
      if (first < rows) lora_b_half_tile<1>(a, a_stride, first, tile, tile_width, tile_start[t], scale, y, y_stride, o);
    }
  }
}
#endif

#if SD_AVX512
// A LoRA's x A^T rows (rank r) quantised like the q4 matmul's activations, for VNNI's byte dot
// products: v = round(a / dx) (dx = max|a| / 32639 a row) = 256 hi + lo, stored as unsigned bytes
// hi + 128 and lo + 128 (the window's sum times 128 * 257 is taken back out).
struct LoraRows {
  const uint8_t* hi;
  const uint8_t* lo;
  const float* dx;
  int64_t rows, rank;
};

static LoraRows quantize_lora_rows(const float* a, int64_t a_stride, int64_t rows, int64_t rank, float* scratch) {
  float* dx = scratch;
  uint8_t* hi = reinterpret_cast<uint8_t*>(scratch + rows);
  uint8_t* lo = hi + rows * rank;
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = a + r * a_stride;
    float largest = 0.f;
    for (int64_t j = 0; j < rank; ++j) largest = std::max(largest, std::fabs(v[j]));
    const float inverse = largest > 0.f ? 32639.f / largest : 0.f;
    dx[r] = largest / 32639.f;
    for (int64_t j = 0; j < rank; ++j) {
      const int32_t code = static_cast<int32_t>(std::nearbyint(v[j] * inverse));
      const int32_t high = (code + 128) >> 8;
      hi[r * rank + j] = static_cast<uint8_t>(high + 128);
      lo[r * rank + j] = static_cast<uint8_t>(code - 256 * high + 128);
    }
  }
  return {hi, lo, dx, rows, rank};
}

// y[r, o] += scale[o] * sum_j B[o, j] a[r, start + j] for the outputs of tiles [begin, end): a tile
// is 16 outputs sharing one window start, its bytes (width / 4) x 16 x 4 (B[o, 4i .. 4i + 3] of
// its outputs side by side), so one VNNI instruction takes four window columns of 16 outputs.
static void lora_b_tiles(const LoraRows& a, const int8_t* tiles, int64_t width, const int32_t* tile_start,
                         const int32_t* window_sum, const float* scale, float* y, int64_t y_stride, int64_t begin,
                         int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const int8_t* tile = tiles + t * width * 16;
    const __m512 sums = _mm512_cvtepi32_ps(_mm512_loadu_si512(window_sum + t * 16));
    const __m512 scales = _mm512_loadu_ps(scale + t * 16);
    for (int64_t r = 0; r < a.rows; ++r) {
      const uint8_t* hi = a.hi + r * a.rank + tile_start[t];
      const uint8_t* lo = a.lo + r * a.rank + tile_start[t];
      __m512i high = _mm512_setzero_si512(), low = _mm512_setzero_si512();
      for (int64_t i = 0; i < width / 4; ++i) {
        const __m512i weights = _mm512_loadu_si512(tile + i * 64);
        int32_t h, l;
        std::memcpy(&h, hi + 4 * i, 4);
        std::memcpy(&l, lo + 4 * i, 4);
        high = _mm512_dpbusd_epi32(high, _mm512_set1_epi32(h), weights);
        low = _mm512_dpbusd_epi32(low, _mm512_set1_epi32(l), weights);
      }
      // 256 hi + lo of the unsigned bytes, less (256 + 1) * 128 * the window's sum (exact in float)
      const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_set1_ps(256.f),
                                         _mm512_fmadd_ps(sums, _mm512_set1_ps(-32896.f), _mm512_cvtepi32_ps(low)));
      float* out = y + r * y_stride + t * 16;
      _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_mul_ps(dot, scales), _mm512_set1_ps(a.dx[r]), _mm512_loadu_ps(out)));
    }
  }
}
#endif

// --- one decode layer, every op here --------------------------------------------------------------

#if SD_AVX512
// The AMX tiles' matmul for a projection's rows (lean_step.cpp sets it: amx_kernels.h, where the CPU
// has AMX and the rows are enough): multiplies the columns it can (the whole groups of 16, or none)
// and returns how many; the vector kernels take the rest. nullptr: never.
using TileMatmul = int64_t (*)(const float* x, int64_t rows, int64_t width, const Q4Weights& w, bool coarse, float* y,
                               int64_t y_stride);
inline TileMatmul tile_matmul = nullptr;
#endif

struct ProjectionView {
  Q4Weights w;  // the base's rows, with a LoRA's A rows stacked under them (w.outputs = out + rank)
  int64_t out = 0;
  const int8_t* window = nullptr;  // the LoRA's B as int8 windows (nullptr: no LoRA)
  int64_t window_width = 0;
  const int32_t* start = nullptr;
  const float* scale = nullptr;
  const int8_t* tiles = nullptr;  // B in tiles of 16 outputs (nullptr: none)
  int64_t tile_width = 0;
  const int32_t* tile_start = nullptr;
  const int32_t* window_sum = nullptr;
};

// y (rows x p.w.outputs; its first p.out columns are the projection) = x times the weights, + the
// LoRA's (x A^T) B^T where there is one. quant: scratch of quant_floats(rows, width).
static void project(const ProjectionView& p, const float* x, int64_t rows, int64_t width, float* y, float* quant) {
  const int64_t stride = p.w.outputs;
  int64_t vector_from = 0;  // the columns from here run the vector kernels
#if SD_AVX512
  if (tile_matmul != nullptr) vector_from = tile_matmul(x, rows, width, p.w, /*coarse=*/false, y, stride);
#endif
  if (vector_from < p.w.outputs) {  // (the tiles quantise the rows their own way: only the vector kernels' here)
    const QuantRows q = quantize_rows(x, rows, width, quant);
    at::parallel_for(vector_from, p.w.outputs, 16, [&](int64_t begin, int64_t end) { q4_rows(p.w, q, y, stride, begin, end); });
  }
  if (p.window == nullptr) return;
#if SD_AVX512
  if (p.tiles != nullptr) {
    const LoraRows a = quantize_lora_rows(y + p.out, stride, rows, p.w.outputs - p.out, quant);
    at::parallel_for(0, p.out / 16, 4, [&](int64_t begin, int64_t end) {
      lora_b_tiles(a, p.tiles, p.tile_width, p.tile_start, p.window_sum, p.scale, y, stride, begin, end);
    });
    return;
  }
#else
  if (p.tiles != nullptr) {
    at::parallel_for(0, p.out / 16, 4, [&](int64_t begin, int64_t end) {
      lora_b_tiles(y + p.out, stride, rows, p.tiles, p.tile_width, p.tile_start, p.scale, y, stride, begin, end);
    });
    return;
  }
#endif
  at::parallel_for(0, p.out, 64, [&](int64_t begin, int64_t end) {
    lora_b_rows(y + p.out, stride, rows, p.window, p.window_width, p.start, p.scale, y, stride, begin, end);
  });
}

struct LayerView {
  const float* input_norm;
  const float* post_norm;
  float input_eps, post_eps, scaling;
  ProjectionView qkv, o, gate_up, down;
  int64_t heads, kv_heads, head_dim, hidden, intermediate;
};

struct StepView {  // one decode step's rows and the layer's cache
  const float* hidden;  // rows x hidden
  int64_t rows;
  const float* cos;     // rows x head_dim
  const float* sin;
  float* keys;          // rows x kv_heads x capacity x head_dim
  float* values;
  int64_t capacity, start;
  const bool* allowed;  // row r's earlier keys allowed at allowed[r * allowed_stride + j], or nullptr: all
  int64_t allowed_stride;
  float* out;           // rows x hidden
};

static inline int64_t layer_scratch_floats(const LayerView& l, int64_t rows, int64_t length) {
  const int64_t widest = std::max(l.hidden, std::max(l.intermediate, l.heads * l.head_dim));
  return rows * (l.hidden + l.qkv.w.outputs + l.heads * l.head_dim + l.o.w.outputs + l.gate_up.w.outputs +
                 l.intermediate + l.down.w.outputs + l.heads * length) + quant_floats(rows, widest) + 64;
}

// Rotary on q's and k's heads, then k and v into the cache at `start`.
static void rotate_and_cache(const LayerView& l, const StepView& s, float* qkv) {
  const int64_t d = l.head_dim, stride = l.qkv.w.outputs;
  for (int64_t r = 0; r < s.rows; ++r) {
    float* row = qkv + r * stride;
    for (int64_t h = 0; h < l.heads + l.kv_heads; ++h) rotate_head(row + h * d, s.cos + r * d, s.sin + r * d, d);
    for (int64_t g = 0; g < l.kv_heads; ++g) {
      const int64_t at = ((r * l.kv_heads + g) * s.capacity + s.start) * d;
      std::memcpy(s.keys + at, row + (l.heads + g) * d, sizeof(float) * d);
      std::memcpy(s.values + at, row + (l.heads + l.kv_heads + g) * d, sizeof(float) * d);
    }
  }
}

// Every row's query heads over the layer's cached prefix (key/value head g serves query heads
// g * group .. (g + 1) * group - 1, as SDPA's enable_gqa repeats them). One task a row's query head:
// a task a key/value head had split a decode row's 3 groups of SmolLM2 2:1 between two threads, the
// first thread's share of attention 2/3 where it could be 5/9 (attention grows with the context);
// attend runs the same loop for each query head either way, so the same floats.
static void attention(const LayerView& l, const StepView& s, const float* qkv, float* attended, float* scores) {
  const int64_t d = l.head_dim, group = l.heads / l.kv_heads, length = s.start + 1;
  const int64_t tasks = s.rows * l.heads;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, length * d));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / l.heads, h = t % l.heads;
      const int64_t cache = (r * l.kv_heads + h / group) * s.capacity * d;
      attend(qkv + r * l.qkv.w.outputs + h * d, 1, s.keys + cache, s.values + cache, length, d, l.scaling,
             s.allowed == nullptr ? nullptr : s.allowed + r * s.allowed_stride, scores + t * length,
             attended + r * l.heads * d + h * d);
    }
  });
}

static void decode_layer(const LayerView& l, const StepView& s, float* scratch) {
  const int64_t rows = s.rows, c = l.hidden, inner = l.intermediate;
  float* normed = scratch;
  float* qkv = normed + rows * c;
  float* attended = qkv + rows * l.qkv.w.outputs;
  float* projected = attended + rows * l.heads * l.head_dim;
  float* gate_up = projected + rows * l.o.w.outputs;
  float* acted = gate_up + rows * l.gate_up.w.outputs;
  float* down = acted + rows * inner;
  float* scores = down + rows * l.down.w.outputs;
  float* quant = scores + rows * l.heads * (s.start + 1);
  for (int64_t r = 0; r < rows; ++r) rms_norm_row(s.hidden + r * c, l.input_norm, l.input_eps, c, normed + r * c);
  project(l.qkv, normed, rows, c, qkv, quant);
  rotate_and_cache(l, s, qkv);
  attention(l, s, qkv, attended, scores);
  project(l.o, attended, rows, l.heads * l.head_dim, projected, quant);
  for (int64_t r = 0; r < rows; ++r) {
    add_rows(s.hidden + r * c, projected + r * l.o.w.outputs, c, s.out + r * c);
    rms_norm_row(s.out + r * c, l.post_norm, l.post_eps, c, normed + r * c);
  }
  project(l.gate_up, normed, rows, c, gate_up, quant);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = gate_up + r * l.gate_up.w.outputs;
    silu_mul(row, row + inner, inner, acted + r * inner);
  }
  project(l.down, acted, rows, inner, down, quant);
  for (int64_t r = 0; r < rows; ++r) add_rows(s.out + r * c, down + r * l.down.w.outputs, c, s.out + r * c);
}

// --- the two-stage LM head's second stage ----------------------------------------------------------

// The indices of the k largest of n values (any order; k <= kMaxCandidates): a min-heap of the best
// so far, and a vector at a time skipped while none of it beats the heap's least.
constexpr int kMaxCandidates = 256;

static void top_candidates(const float* v, int64_t n, int k, int32_t* best) {
  float value[kMaxCandidates];
  int count = 0;
  const auto sift_down = [&](int at) {
    for (;;) {
      int least = at;
      const int left = 2 * at + 1, right = left + 1;
      if (left < count && value[left] < value[least]) least = left;
      if (right < count && value[right] < value[least]) least = right;
      if (least == at) return;
      std::swap(value[at], value[least]);
      std::swap(best[at], best[least]);
      at = least;
    }
  };
  const auto offer = [&](float x, int64_t index) {
    if (count < k) {
      int at = count++;
      value[at] = x;
      best[at] = static_cast<int32_t>(index);
      while (at > 0 && value[(at - 1) / 2] > value[at]) {  // sift up
        std::swap(value[at], value[(at - 1) / 2]);
        std::swap(best[at], best[(at - 1) / 2]);
        at = (at - 1) / 2;
      }
    } else if (x > value[0]) {
      value[0] = x;
      best[0] = static_cast<int32_t>(index);
      sift_down(0);
    }
  };
  int64_t j = 0;
  for (; j + kW <= n; j += kW) {
    if (count == k && !vany_greater(vload(v + j), value[0])) continue;
    for (int t = 0; t < kW; ++t) offer(v[j + t], j + t);
  }
  for (; j < n; ++j) offer(v[j], j);
}

// logits (rows x vocab) hold the 4-bit scan; the top `k` of each row are rescored exactly: float rows
// (the embedding the head is tied to) or int8 rows times their bfloat16 scales.
static void rescore_candidates(const float* x, int64_t rows, int64_t width, float* logits, int64_t vocab, int k,
                               const float* float_rows, const int8_t* int8_rows, const uint16_t* scales) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int32_t best[kMaxCandidates];
      float* row = logits + r * vocab;
      const float* xr = x + r * width;
      top_candidates(row, vocab, k, best);
      for (int c = 0; c < k; ++c) {
        const int64_t token = best[c];
        if (float_rows != nullptr) {
          row[token] = dot(float_rows + token * width, xr, width);
        } else {
          const int8_t* weights = int8_rows + token * width;
          vf acc = vzero();
          int64_t j = 0;
          for (; j + kW <= width; j += kW) acc = vfma(vload_i8(weights + j), vload(xr + j), acc);
          float total = vsum(acc);
          for (; j < width; ++j) total += static_cast<float>(weights[j]) * xr[j];
          row[token] = total * bf16_to_float(scales[token]);
        }
      }
    }
  });
}
