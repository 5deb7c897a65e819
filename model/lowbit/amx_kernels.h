// The q4 matmul on AMX tiles (Intel AMX-INT8: Sapphire Rapids and later) for a batch's or a
// prompt's rows. lean_step.cpp includes this file once, inside `namespace amx` under a GCC target
// with AVX-512 and AMX, and runs it where the CPU has AMX-INT8, the kernel lets this process use
// the tile registers (arch_prctl) and a matmul has enough rows (q4_amx_rows).
//
// The SAME integers as the vector kernels (decode_kernels.h): activations quantised per block of
// 32 to 16-bit codes v = 256 hi + lo (two signed bytes), weights the 4-bit codes q (0..15) of a
// Q4 block, and per block sum_j q_j v_j = 256 sum_j q_j hi_j + sum_j q_j lo_j exact in int32; then
// times scale dx plus the block's float sum times (zero - 8 scale). Only the order of the float
// additions differs from the vector kernels (~1e-7 relative).
//
// Why tiles: a batch or prompt multiplies every weight by many rows, and the vector kernels spend
// most of their instructions on VNNI products (two a 16-bit product) and the per-block scaling.
// One tile product (tdpbssd) multiplies 16 rows x 32 codes by 32 codes x 16 columns, 8192 byte
// products, on the tile unit; the vector units only scale the 16 x 16 block sums and add them up.
//
// Layout, per group of 16 output columns (the C tile's width) and block b of 32 codes:
//   A (activations): rows x 32 bytes, hi and lo separately (two tiles), read in place from the
//     rows' byte planes (AmxRows: row-major, K bytes a row);
//   B (weights): 8 rows x 64 bytes in the tile unit's layout, B[kk][4 n + i] = q[column n][4 kk + i],
//     unpacked from the Q4 bytes (byte j of a block holds q[j] low and q[j + 16] high: its low nibbles
//     are B's rows 0-3, its high ones rows 4-7, once the 16 columns' 4-byte pieces are transposed);
//   C: rows x 16 int32 per block, hi and lo, combined and scaled by the vector units into float
//     sums kept in registers across the blocks.
// A group's B tiles and scales are unpacked once into a scratch buffer and serve every row tile.
// Where the weights were also laid out for the tiles when they were loaded (amx_layout: per group of
// 16 columns and block, the B tile's 8 rows still as 4 rows of nibble pairs, 256 bytes, then the 16
// columns' (scale, zero) pairs, 64 bytes), that unpacking is two masks a row of bytes; otherwise the
// 16 columns' bytes are transposed and their pairs gathered every time (a fifth of a batch-8 step).

// (lean_step.cpp includes <cpuid.h> and, on Linux, <sys/syscall.h> and <unistd.h> for amx_usable.)

// What the matmul's rows become for the tile unit: padded to a multiple of the row tile with zero
// rows (their outputs are never written).
struct AmxRows {
  int64_t rows = 0, padded = 0, width = 0, blocks = 0;
  int8_t* hi = nullptr;  // padded x width: each code's high byte
  int8_t* lo = nullptr;  // padded x width: its low byte (v = 256 hi + lo, lo in [-128, 127])
  float* dx = nullptr;   // padded x blocks: each block's scale
  float* sum = nullptr;  // padded x blocks: each block's float sum
};

static inline int64_t amx_row_tile(int64_t rows) { return rows <= 8 ? 8 : 16; }

// rows rounded up to whole row tiles
static inline int64_t amx_padded_rows(int64_t rows) {
  const int64_t tile = amx_row_tile(rows);
  return (rows + tile - 1) / tile * tile;
}

// scratch floats amx_quantize needs
static inline int64_t amx_quant_floats(int64_t rows, int64_t width) {
  const int64_t padded = amx_padded_rows(rows);
  return padded * width / 2 + padded * (width / 32) * 2 + 64;
}

static AmxRows amx_quantize(const float* x, int64_t rows, int64_t width, float* scratch) {
  AmxRows a;
  a.rows = rows;
  a.width = width;
  a.blocks = width / 32;
  a.padded = amx_padded_rows(rows);
  a.hi = reinterpret_cast<int8_t*>(scratch);
  a.lo = a.hi + a.padded * width;
  a.dx = scratch + a.padded * width / 2;
  a.sum = a.dx + a.padded * a.blocks;
  // (row, block) pairs split between the threads for a prompt's rows; a decode batch's few hundred
  // (microseconds of work) run on the calling thread, sparing a fork and join
  at::parallel_for(0, a.padded * a.blocks, 1024, [&](int64_t begin, int64_t end) {
    int16_t codes[32];
    for (int64_t cell = begin; cell < end; ++cell) {
      const int64_t r = cell / a.blocks, b = cell % a.blocks;
      float scale = 0.f, sum = 0.f;
      if (r < rows) {
        avx512::quantize_block(x + r * width + b * 32, true, codes, &scale, &sum);
      } else {
        std::memset(codes, 0, sizeof(codes));
      }
      a.dx[cell] = scale;  // cell = r * blocks + b
      a.sum[cell] = sum;
      // hi = (v + 128) >> 8 (as the vector kernels split it; v + 128 stays inside int16: |v| <= 32639),
      // lo = v - 256 hi, in [-128, 127]: both fit a byte
      const __m512i v = _mm512_loadu_si512(codes);
      const __m512i hi = _mm512_srai_epi16(_mm512_add_epi16(v, _mm512_set1_epi16(128)), 8);
      const __m512i lo = _mm512_sub_epi16(v, _mm512_slli_epi16(hi, 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.hi + r * width + b * 32), _mm512_cvtepi16_epi8(hi));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.lo + r * width + b * 32), _mm512_cvtepi16_epi8(lo));
    }
  });
  return a;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0/1: C hi/lo of the first column group, 6/7 of the second (R x 16 int32); 2/3: A hi/lo
// (R x 32 bytes); 4/5: B of the two groups (8 x 64 bytes). Stacked (amx_one_tile_pair, R = 8): C
// tiles 0 and 6 of 16 rows (hi over lo) and A tile 2 of 16 rows, the rows' hi and lo bytes together.
static inline void configure_tiles(int rows, bool stacked) {
  TileConfig config;
  const int c_rows = stacked ? 16 : rows;
  for (int t : {0, 6}) {
    config.colsb[t] = 64;
    config.rows[t] = static_cast<uint8_t>(c_rows);
  }
  config.colsb[2] = 32;
  config.rows[2] = static_cast<uint8_t>(c_rows);
  if (!stacked) {
    config.colsb[1] = config.colsb[7] = 64;
    config.rows[1] = config.rows[7] = static_cast<uint8_t>(rows);
    config.colsb[3] = 32;
    config.rows[3] = static_cast<uint8_t>(rows);
  }
  config.colsb[4] = config.colsb[5] = 64;
  config.rows[4] = config.rows[5] = 8;
  // GCC 12 at -O3 has dropped some of the stores above as dead where this function was inlined (it does
  // not see that ldtilecfg reads them): the tiles then ran unconfigured (an illegal instruction at the
  // first tile op) or the load faulted. The empty asm tells it the memory is read.
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

constexpr int64_t kBTileBytes = 512;    // a block's B tile for 16 columns: 8 rows x 64 bytes
constexpr int64_t kLayoutBlockBytes = 320;  // a block of 16 columns in amx_layout: 256 nibble bytes + 64 pair bytes

// Block b of columns o .. o + 15 transposed for the B tile: rows[kk] (kk 0-3) holds column n's bytes
// 4kk .. 4kk + 3 at dword n (low nibbles: B's row kk, high ones: row kk + 4), and pairs the 16 columns'
// (scale, zero) bfloat16 pairs, one 32-bit lane each.
static inline void transpose_block(const uint8_t* qs, const uint16_t* sz, int64_t blocks, int64_t o, int64_t b,
                                   __m512i (&rows)[4], __m512i& pairs) {
  const int64_t row_bytes = blocks * 16;
  // Stage 1 takes dwords kk, kk+1 of each column of two registers (4 columns each), stage 2 joins halves.
  const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i second = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i low_halves = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11);
  const __m512i high_halves = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
  const __m512i pair_index = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32(static_cast<int32_t>(blocks)));  // column n's pairs
  __m512i columns[4];  // register p: columns 4p .. 4p + 3, 16 bytes each (dword kk: bytes 4kk .. 4kk + 3)
  for (int p = 0; p < 4; ++p) {
    const uint8_t* at = qs + (o + 4 * p) * row_bytes + b * 16;
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + row_bytes)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 2 * row_bytes)), 2);
    columns[p] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 3 * row_bytes)), 3);
  }
  // a01: kk 0 for columns 0-7, kk 1 for columns 0-7; b01: kk 2, kk 3; likewise a23, b23 for columns 8-15
  const __m512i a01 = _mm512_permutex2var_epi32(columns[0], first, columns[1]);
  const __m512i b01 = _mm512_permutex2var_epi32(columns[0], second, columns[1]);
  const __m512i a23 = _mm512_permutex2var_epi32(columns[2], first, columns[3]);
  const __m512i b23 = _mm512_permutex2var_epi32(columns[2], second, columns[3]);
  rows[0] = _mm512_permutex2var_epi64(a01, low_halves, a23);
  rows[1] = _mm512_permutex2var_epi64(a01, high_halves, a23);
  rows[2] = _mm512_permutex2var_epi64(b01, low_halves, b23);
  rows[3] = _mm512_permutex2var_epi64(b01, high_halves, b23);
  pairs = _mm512_i32gather_epi32(pair_index, sz + o * blocks * 2 + b * 2, 4);
}

// Block b's B tile (from its 4 transposed rows) and its 16 columns' scales and (zero - 8 scale)
// (from their pairs) into `tile` (kBTileBytes) and `scales` (32 floats).
static inline void unpack_block(const __m512i (&rows)[4], __m512i pairs, int8_t* tile, float* scales) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int kk = 0; kk < 4; ++kk) {
    _mm512_store_si512(tile + kk * 64, _mm512_and_si512(rows[kk], nibble));                             // q[4kk + i]
    _mm512_store_si512(tile + (kk + 4) * 64, _mm512_and_si512(_mm512_srli_epi16(rows[kk], 4), nibble));  // q[16 + 4kk + i]
  }
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
  const __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
  _mm512_store_ps(scales, scale);
  _mm512_store_ps(scales + 16, _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), scale, zero));
}

// Columns o .. o + 15, every block: the B tiles (kBTileBytes each) into `tiles` and per block the 16
// columns' scales and (zero - 8 scale) into `scales` (32 floats a block). `laid_out`: the group's
// blocks in amx_layout (nullptr: transposed from qs and sz here).
static void unpack_group(const uint8_t* qs, const uint16_t* sz, const uint8_t* laid_out, int64_t blocks, int64_t o,
                         int8_t* tiles, float* scales) {
  __m512i rows[4], pairs;
  for (int64_t b = 0; b < blocks; ++b) {
    if (laid_out != nullptr) {
      const uint8_t* at = laid_out + b * kLayoutBlockBytes;
      for (int64_t line = 0; line < kLayoutBlockBytes; line += 64) {  // the vector kernels' distance ahead
        _mm_prefetch(reinterpret_cast<const char*>(at) + avx512::kPrefetchBytes + line, _MM_HINT_T0);
      }
      for (int kk = 0; kk < 4; ++kk) rows[kk] = _mm512_loadu_si512(at + kk * 64);
      pairs = _mm512_loadu_si512(at + 256);
    } else {
      transpose_block(qs, sz, blocks, o, b, rows, pairs);
    }
    unpack_block(rows, pairs, tiles + b * kBTileBytes, scales + b * 32);
  }
}

// The weights' whole groups of 16 columns laid out for the tiles (the layout above: groups x blocks x
// kLayoutBlockBytes), written into `out`; built once when the weights are loaded.
static void amx_layout(const uint8_t* qs, const uint16_t* sz, int64_t outputs, int64_t blocks, uint8_t* out) {
  at::parallel_for(0, outputs / 16, 1, [&](int64_t begin, int64_t end) {
    __m512i rows[4], pairs;
    for (int64_t g = begin; g < end; ++g) {
      for (int64_t b = 0; b < blocks; ++b) {
        transpose_block(qs, sz, blocks, g * 16, b, rows, pairs);
        uint8_t* at = out + (g * blocks + b) * kLayoutBlockBytes;
        for (int kk = 0; kk < 4; ++kk) _mm512_storeu_si512(at + kk * 64, rows[kk]);
        _mm512_storeu_si512(at + 256, pairs);
      }
    }
  });
}

// A block's tile sums of one row tile, two column groups: hi and lo, R x 16 int32 each; a group's lo
// follows its hi, so that a stacked C tile (hi rows over lo rows, below) stores both at once.
template <int R>
struct alignas(64) BlockSums {
  struct alignas(64) Group {
    int32_t hi[R * 16], lo[R * 16];
  } group[2];
};

// The float work of block b's sums into the accumulators (R rows x 2 groups of 16 columns, kept in
// registers across the blocks: through memory they had been a load and a store for every row, group
// and block). scales[g]: group g's 16 scales and 16 (zero - 8 scale) of this block. Coarse: the high
// bytes alone (the head's ranking scan, as the vector kernels' Coarse).
template <int R, bool Coarse>
__attribute__((always_inline)) static inline void add_block(const BlockSums<R>& sums, const float* const scales[2],
                                                            const float* dx, const float* sum, int64_t blocks,
                                                            int64_t b, __m512 (&acc)[R][2]) {
  for (int g = 0; g < 2; ++g) {
    const __m512 scale = _mm512_load_ps(scales[g]);
    const __m512 zero_term = _mm512_load_ps(scales[g] + 16);
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) {
      __m512i whole = _mm512_slli_epi32(_mm512_load_si512(sums.group[g].hi + m * 16), 8);
      if (!Coarse) whole = _mm512_add_epi32(whole, _mm512_load_si512(sums.group[g].lo + m * 16));
      const __m512 total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(whole),
                                           _mm512_mul_ps(scale, _mm512_set1_ps(dx[m * blocks + b])), acc[m][g]);
      acc[m][g] = _mm512_fmadd_ps(zero_term, _mm512_set1_ps(sum[m * blocks + b]), total);
    }
  }
}

// Row tile `first` .. first + R of `a` against two groups of 16 columns (from o[0] and o[1]; their B
// tiles and scales unpacked): y's rows below a.rows. Software-pipelined: block b's tile products run on
// the tile unit while the vector units add up block b - 1's sums (two buffers of sums).
//
// coming: the next pair's bytes in amx_layout (2 x blocks x kLayoutBlockBytes, nullptr: none), asked
// for into L2 a block's share at a time, so that memory delivers them during this pair's products
// rather than while the next pair is unpacked (reading the weights had been a fifth of a batch step).
template <int R, bool Coarse>
static void amx_row_tile_pair(const AmxRows& a, int64_t first, const int8_t* const tiles[2],
                              const float* const scales[2], const int64_t o[2], const uint8_t* coming, float* y,
                              int64_t y_stride) {
  BlockSums<R> sums[2];
  __m512 acc[R][2];
  for (int m = 0; m < R; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  const int8_t* hi = a.hi + first * a.width;
  const int8_t* lo = a.lo + first * a.width;
  const float* dx = a.dx + first * a.blocks;
  const float* sum = a.sum + first * a.blocks;
  for (int64_t b = 0; b <= a.blocks; ++b) {
    if (coming != nullptr && b < a.blocks) {
      const char* next = reinterpret_cast<const char*>(coming) + b * 2 * kLayoutBlockBytes;
      for (int64_t line = 0; line < 2 * kLayoutBlockBytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T1);
    }
    if (b < a.blocks) {
      _tile_zero(0);
      _tile_zero(6);
      _tile_loadd(2, hi + b * 32, a.width);
      _tile_loadd(4, tiles[0] + b * kBTileBytes, 64);
      _tile_loadd(5, tiles[1] + b * kBTileBytes, 64);
      _tile_dpbssd(0, 2, 4);
      _tile_dpbssd(6, 2, 5);
      if (!Coarse) {
        _tile_zero(1);
        _tile_zero(7);
        _tile_loadd(3, lo + b * 32, a.width);
        _tile_dpbssd(1, 3, 4);
        _tile_dpbssd(7, 3, 5);
      }
    }
    if (b > 0) {
      const float* const block_scales[2] = {scales[0] + (b - 1) * 32, scales[1] + (b - 1) * 32};
      add_block<R, Coarse>(sums[(b - 1) % 2], block_scales, dx, sum, a.blocks, b - 1, acc);
    }
    if (b < a.blocks) {
      BlockSums<R>& into = sums[b % 2];
      _tile_stored(0, into.group[0].hi, 64);
      _tile_stored(6, into.group[1].hi, 64);
      if (!Coarse) {
        _tile_stored(1, into.group[0].lo, 64);
        _tile_stored(7, into.group[1].lo, 64);
      }
    }
  }
  for (int m = 0; m < R && first + m < a.rows; ++m) {
    for (int g = 0; g < 2; ++g) _mm512_storeu_ps(y + (first + m) * y_stride + o[g], acc[m][g]);
  }
}

// One row tile (a decode batch of up to 16 rows): every B tile serves a single tile product, so the
// group-wide unpacking above would write each pair's tiles out (up to 60 KB, past L1) only to read them
// back once. Here each block is unpacked kRingAhead blocks before its product into a small ring that
// stays in L1, and the vector stores have long reached it when the tile unit loads them (in the
// group-wide form the stores, L2 and the tile loads had waited on one another: 1.5-1.6x on a batch-8
// sweep of the default model's matrices, the same bits).
//
// Stacked (R = 8, rows <= 8): the rows' hi and lo bytes are one A tile of 16 rows (AmxRows keeps lo
// padded x width bytes after hi, so row 8 + m of the tile is row m's lo), and one tile product a group
// gives both sums, where two products of 8 rows had each used half the tile unit's rows. Not for a
// ranking (Coarse: the head's scan reads the hi sums alone): its A tile is the 8 rows' hi bytes, and a
// product of 8 rows takes the tile unit about half as long as one of 16 (the head's scan at batch 8
// 1.07-1.18x in a C++ harness against the stacked form, the same bits).
constexpr int kRingAhead = 2;  // blocks unpacked ahead of their product (2-3 measured alike; 1 is slower)
constexpr int kRingSlots = 4;  // > kRingAhead: a slot is not rewritten while its sums may still be read

struct alignas(64) BlockRing {
  int8_t tile[kRingSlots][2][kBTileBytes];
  float scales[kRingSlots][2][32];
};

// Block b of a pair's group g into the ring: from the load-time layout (groups[g]: the group's blocks)
// or transposed from qs and sz.
static inline void ring_unpack(const uint8_t* qs, const uint16_t* sz, const uint8_t* const groups[2],
                               const int64_t o[2], int64_t blocks, int64_t b, BlockRing& ring) {
  __m512i rows[4], pairs;
  const int slot = static_cast<int>(b % kRingSlots);
  for (int g = 0; g < 2; ++g) {
    if (groups[g] != nullptr) {
      const uint8_t* at = groups[g] + b * kLayoutBlockBytes;
      for (int64_t line = 0; line < kLayoutBlockBytes; line += 64) {  // the vector kernels' distance ahead
        _mm_prefetch(reinterpret_cast<const char*>(at) + avx512::kPrefetchBytes + line, _MM_HINT_T0);
      }
      for (int kk = 0; kk < 4; ++kk) rows[kk] = _mm512_loadu_si512(at + kk * 64);
      pairs = _mm512_loadu_si512(at + 256);
    } else {
      transpose_block(qs, sz, blocks, o[g], b, rows, pairs);
    }
    unpack_block(rows, pairs, ring.tile[slot][g], ring.scales[slot][g]);
  }
}

// All rows of `a` (one row tile: a.padded == R) against two groups of 16 columns (from o[0] and o[1]),
// the blocks unpacked on the way through a ring; software-pipelined as amx_row_tile_pair. groups: the
// pair's blocks in amx_layout (nullptr: transposed from qs and sz); coming: the next pair's, asked for
// into L2 a block's share at a time. This loop and ring_unpack repeat amx_row_tile_pair's tile calls and
// unpack_group's read of the layout on purpose: with those lines shared through inlined helpers GCC 12
// compiled the 8-row loop 7-10% slower (a C++ harness against this version, the same bits).
template <int R, bool Coarse>
static void amx_one_tile_pair(const uint8_t* qs, const uint16_t* sz, const uint8_t* const groups[2],
                              const uint8_t* coming, const AmxRows& a, const int64_t o[2], float* y,
                              int64_t y_stride) {
  constexpr bool stacked = R == 8 && !Coarse;
  BlockSums<R> sums[2];
  BlockRing ring;
  __m512 acc[R][2];
  for (int m = 0; m < R; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kRingAhead && b < a.blocks; ++b) ring_unpack(qs, sz, groups, o, a.blocks, b, ring);
  for (int64_t b = 0; b <= a.blocks; ++b) {
    const int slot = static_cast<int>(b % kRingSlots);
    if (coming != nullptr && b < a.blocks) {
      const char* next = reinterpret_cast<const char*>(coming) + b * 2 * kLayoutBlockBytes;
      for (int64_t line = 0; line < 2 * kLayoutBlockBytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T1);
    }
    if (b < a.blocks) {
      _tile_zero(0);
      _tile_zero(6);
      _tile_loadd(2, a.hi + b * 32, a.width);  // stacked: 16 rows, the lo rows after the hi ones
      _tile_loadd(4, ring.tile[slot][0], 64);
      _tile_loadd(5, ring.tile[slot][1], 64);
      _tile_dpbssd(0, 2, 4);
      _tile_dpbssd(6, 2, 5);
      if (!stacked && !Coarse) {
        _tile_zero(1);
        _tile_zero(7);
        _tile_loadd(3, a.lo + b * 32, a.width);
        _tile_dpbssd(1, 3, 4);
        _tile_dpbssd(7, 3, 5);
      }
    }
    if (b + kRingAhead < a.blocks) ring_unpack(qs, sz, groups, o, a.blocks, b + kRingAhead, ring);
    if (b > 0) {
      const int last = static_cast<int>((b - 1) % kRingSlots);
      const float* const scales[2] = {ring.scales[last][0], ring.scales[last][1]};
      add_block<R, Coarse>(sums[(b - 1) % 2], scales, a.dx, a.sum, a.blocks, b - 1, acc);
    }
    if (b < a.blocks) {
      BlockSums<R>& into = sums[b % 2];
      _tile_stored(0, into.group[0].hi, 64);  // stacked: 16 rows, through hi into lo
      _tile_stored(6, into.group[1].hi, 64);
      if (!stacked && !Coarse) {
        _tile_stored(1, into.group[0].lo, 64);
        _tile_stored(7, into.group[1].lo, 64);
      }
    }
  }
  for (int m = 0; m < R && m < a.rows; ++m) {
    for (int g = 0; g < 2; ++g) _mm512_storeu_ps(y + m * y_stride + o[g], acc[m][g]);
  }
}

// Column groups [group_begin, group_end) (16 columns each) of every row, two at a time (an odd last
// group is paired with itself: its columns are written twice, the same values). Per thread: its tile
// configuration (state of the thread), then each pair's B tiles unpacked once for all row tiles.
// laid_out: the weights in amx_layout (nullptr: none).
template <bool Coarse>
static void q4_amx_groups(const uint8_t* qs, const uint16_t* sz, const uint8_t* laid_out, const AmxRows& a, float* y,
                          int64_t y_stride, int64_t group_begin, int64_t group_end) {
  const int tile = static_cast<int>(amx_row_tile(a.rows));
  const int64_t group_bytes = a.blocks * kLayoutBlockBytes;
  const bool one_tile = a.padded == tile;
  configure_tiles(tile, one_tile && tile == 8 && !Coarse);  // (amx_one_tile_pair's stacked)
  if (one_tile) {  // the blocks through a ring (amx_one_tile_pair)
    for (int64_t g = group_begin; g < group_end; g += 2) {
      const int64_t o[2] = {g * 16, (g + 1 < group_end ? g + 1 : g) * 16};
      const uint8_t* const groups[2] = {laid_out != nullptr ? laid_out + o[0] / 16 * group_bytes : nullptr,
                                        laid_out != nullptr ? laid_out + o[1] / 16 * group_bytes : nullptr};
      const uint8_t* coming = laid_out != nullptr && g + 2 < group_end ? laid_out + (g + 2) * group_bytes : nullptr;
      if (tile == 8) {
        amx_one_tile_pair<8, Coarse>(qs, sz, groups, coming, a, o, y, y_stride);
      } else {
        amx_one_tile_pair<16, Coarse>(qs, sz, groups, coming, a, o, y, y_stride);
      }
    }
    _tile_release();
    return;
  }
  thread_local std::vector<int8_t> tile_buffer;
  thread_local std::vector<float> scale_buffer;
  const int64_t tile_bytes = a.blocks * kBTileBytes, scale_floats = a.blocks * 32;
  tile_buffer.resize(static_cast<size_t>(2 * tile_bytes + 64));
  scale_buffer.resize(static_cast<size_t>(2 * scale_floats + 16));
  // 64-byte aligned views (the unpacking stores and the scales' loads are aligned ones)
  auto* tiles0 = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(tile_buffer.data()) + 63) & ~uintptr_t(63));
  auto* scales0 = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scale_buffer.data()) + 63) & ~uintptr_t(63));
  const int8_t* const tiles[2] = {tiles0, tiles0 + tile_bytes};
  const float* const scales[2] = {scales0, scales0 + scale_floats};
  for (int64_t g = group_begin; g < group_end; g += 2) {
    const int64_t o[2] = {g * 16, (g + 1 < group_end ? g + 1 : g) * 16};
    for (int k = 0; k < 2; ++k) {
      unpack_group(qs, sz, laid_out != nullptr ? laid_out + o[k] / 16 * group_bytes : nullptr, a.blocks, o[k],
                   tiles0 + k * tile_bytes, scales0 + k * scale_floats);
    }
    // the next pair's bytes, asked for during the first row tile (a prompt's others find them there)
    const uint8_t* coming = laid_out != nullptr && g + 2 < group_end ? laid_out + (g + 2) * group_bytes : nullptr;
    for (int64_t first = 0; first < a.padded; first += tile) {
      if (tile == 8) {
        amx_row_tile_pair<8, Coarse>(a, first, tiles, scales, o, first == 0 ? coming : nullptr, y, y_stride);
      } else {
        amx_row_tile_pair<16, Coarse>(a, first, tiles, scales, o, first == 0 ? coming : nullptr, y, y_stride);
      }
    }
  }
  _tile_release();
}

// Rows of x (rows x width) times the Q4 weights' whole groups of 16 columns (outputs / 16 of them)
// into y (row stride y_stride); the caller multiplies the outputs % 16 columns left. laid_out: the
// weights in amx_layout, or nullptr. coarse: the high bytes of the activations alone (a ranking). Its
// own scratch (a decode layer holds the extension's scratch buffer while it projects).
static void q4_amx_matmul(const float* x, int64_t rows, int64_t width, const uint8_t* qs, const uint16_t* sz,
                          const uint8_t* laid_out, int64_t outputs, bool coarse, float* y, int64_t y_stride) {
  thread_local std::vector<float> buffer;
  buffer.resize(static_cast<size_t>(amx_quant_floats(rows, width)));
  const AmxRows a = amx_quantize(x, rows, width, buffer.data());
  const int64_t groups = outputs / 16, pairs = (groups + 1) / 2;
  // Threads take chunks of pairs of groups as they come free rather than a fixed half each: the two
  // cores of a virtual machine do not keep one pace, and with a fixed split the first to finish had
  // waited at every matmul's end (~15% of a batch-8 step on this 2-core machine).
  const int64_t threads = at::get_num_threads();
  const int64_t chunk = std::max<int64_t>(1, pairs / (8 * threads));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t first = next.fetch_add(chunk); first < pairs; first = next.fetch_add(chunk)) {
      const int64_t begin = 2 * first, end = std::min(groups, 2 * (first + chunk));
      if (coarse) {
        q4_amx_groups<true>(qs, sz, laid_out, a, y, y_stride, begin, end);
      } else {
        q4_amx_groups<false>(qs, sz, laid_out, a, y, y_stride, begin, end);
      }
    }
  });
}

// This CPU has AMX-INT8 (CPUID leaf 7: AMX-TILE and AMX-INT8) and the kernel lets this process use
// the tile data (Linux: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; without it the first tile
// instruction is an illegal instruction). Asked once.
static bool amx_usable() {
#if defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = (edx >> 24) & 1U, int8 = (edx >> 25) & 1U;
  if (!tile || !int8) return false;
  constexpr long kRequestPermission = 0x1023, kXTileData = 18;
  return syscall(SYS_arch_prctl, kRequestPermission, kXTileData) == 0;
#else
  return false;
#endif
}
