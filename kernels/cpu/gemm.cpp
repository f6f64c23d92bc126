// linear_act: out[M, N] = act(x[M, K] @ w[N, K]^T + bias[N]), fp32, the FFN
// up-projection with its bias + GELU epilogue fused (act may be "none").
//
// Layout: x row-major [M, K] (lda = K), w row-major [N, K] (torch's Linear weight),
// out row-major [M, N]. w is packed into panels of NR columns, [N / NR][K][NR]
// (zero-padded), so the micro-kernel reads it with unit stride: linear_pack once
// per weight (a model's PackedWeight, bertfast/ops/cpu/weights.py), then
// linear_packed per call; linear_act packs and multiplies in one go. linear_packed
// also reads panels wider than NR (a multiple of it): oneDNN's fp32 weight layout
// [N / 64][K][64] on AVX-512, so a weight oneDNN holds needs no second copy here.
//
// Micro-kernel: MR rows x NR columns of accumulators held in registers (GCC/Clang
// vector extensions, no intrinsics); per k one load of NR packed weights and MR
// broadcasts of x. Two variants chosen at run time from the CPU:
//   AVX-512 (x86-64-v4): MR = 8, NR = 32 (16 zmm accumulators)
//   AVX2/FMA (baseline): MR = 4, NR = 16 (8 ymm accumulators)
// and, at few rows, a kernel that streams each weight panel once (gemm_tile_few_rows:
// AVX-512 up to 128 rows; AVX2, with a 6 x 16 register tile over each 16-column slice
// of a panel, up to 64 rows).
// (allow_avx512 = false forces the baseline, for tests.)
// Threads: OpenMP static split over (block of MB rows, NR-column panel) tiles,
// ordered row-block major for weights up to 8 MiB (see gemm_packed).
//
// Large outputs: a fresh output tensor above glibc's mmap threshold (at most 32 MiB,
// e.g. the QKV and FFN-in outputs of 8192 tokens) is new mmap memory on every call,
// and faulting it in 4 KiB pages inside the GEMM cost as much as the GEMM itself
// (8192 x 1152: 30 ms per call instead of 16). linear_packed therefore asks for
// transparent huge pages on the whole 2 MiB pages inside the output first
// (madvise(MADV_HUGEPAGE), advice only: no effect where THP is off, or on pages
// already present).
#include <cstdint>
#include <vector>

#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t MB = 64;  // rows per task
constexpr int64_t KC = 64;  // reduction chunk summed in registers

template <typename V>
BF_INLINE V load_v(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));  // unaligned load
  return v;
}

// One k step of an MR x (VL * NV) register tile: acc[r] += a[r][k] * b[0 .. VL * NV).
template <typename V, int VL, int MR, int NV>
BF_INLINE void fma_step(V (&acc)[MR][NV], const float* const* a, int64_t k,
                        const float* BF_RESTRICT b) {
  V bv[NV];
  for (int v = 0; v < NV; ++v) bv[v] = load_v<V>(b + v * VL);
  for (int r = 0; r < MR; ++r) {
    const float av = a[r][k];
    for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
  }
}

// A K chunk's register sums added into the tile's totals (rows of VL * NV floats).
template <typename V, int VL, int MR, int NV>
BF_INLINE void add_chunk(float* BF_RESTRICT total, const V (&acc)[MR][NV]) {
  constexpr int NR = VL * NV;
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      V t = load_v<V>(total + r * NR + v * VL) + acc[r][v];
      std::memcpy(total + r * NR + v * VL, &t, sizeof(V));
    }
}

// Epilogue: `rows` rows of sums (`stride` floats apart) plus bias[n0 ..], through the
// activation, into out's rows (N floats apart) from column n0, ncols columns.
template <int ACT>
BF_INLINE void store_rows(const float* BF_RESTRICT total, int64_t stride,
                          const float* BF_RESTRICT bias, float* BF_RESTRICT out, int64_t rows,
                          int64_t N, int64_t n0, int64_t ncols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* tmp = total + r * stride;
    float* o = out + r * N + n0;
    for (int64_t j = 0; j < ncols; ++j) o[j] = tmp[j] + bias[n0 + j];
    if (ACT != kNoActivation) activate_inplace<float>(ACT, o, ncols);
  }
}

// One tile: rows [mb * MB, min(M, (mb + 1) * MB)) x the NR columns [p * NR, p * NR + NR).
// The weight is stored in panels of PW >= NR columns ([N / PW][K][PW], PW a multiple
// of NR): the tile reads NR of them, PW apart per k.
template <typename V, int VL, int MR, int NV, int ACT>
BF_INLINE void gemm_tile(const float* BF_RESTRICT x, const float* BF_RESTRICT packed,
                         const float* BF_RESTRICT bias, float* BF_RESTRICT out, int64_t M,
                         int64_t N, int64_t K, int64_t PW, int64_t mb, int64_t p) {
  constexpr int NR = VL * NV;
  const int64_t n0 = p * NR;
  const float* BF_RESTRICT bp = packed + (n0 / PW) * K * PW + n0 % PW;
  const int64_t ncols = N - n0 < NR ? N - n0 : NR;
  const int64_t m_end = (mb + 1) * MB < M ? (mb + 1) * MB : M;
  for (int64_t i0 = mb * MB; i0 < m_end; i0 += MR) {
    const int rows = static_cast<int>(m_end - i0 < MR ? m_end - i0 : MR);
    const float* a[MR];
    for (int r = 0; r < MR; ++r) a[r] = x + (i0 + (r < rows ? r : rows - 1)) * K;
    // K is summed in chunks of KC in registers, chunk sums added into `total`:
    // rounding error grows with KC + K / KC instead of K (BLAS-like accuracy).
    alignas(64) float total[MR][NR] = {};
    const float* BF_RESTRICT b = bp;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t k1 = k0 + KC < K ? k0 + KC : K;
      V acc[MR][NV];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = V{};
      for (int64_t k = k0; k < k1; ++k, b += PW) fma_step<V, VL, MR, NV>(acc, a, k, b);
      add_chunk<V, VL, MR, NV>(&total[0][0], acc);
    }
    // Epilogue: bias + activation, written for the valid rows / columns only.
    store_rows<ACT>(&total[0][0], NR, bias, out + i0 * N, rows, N, n0, ncols);
  }
}

// Few rows (M <= kFewRows): one tile is every row x one whole panel of PW = VL * NV
// columns, and the reduction runs chunk-outer: each KC-deep chunk of the panel (KC x
// PW floats, 16 KiB at PW = 64) is read from L3 / memory once and then from L1 for
// every group of MR rows, whose sums wait in `total` between chunks. The panel is read
// as one sequential stream (the row-block kernel above reads NR of its PW columns per
// tile, a strided stream, and once per MR rows). Sums are formed exactly as there
// (per chunk in registers, chunks added into total in order): the same results.
//
// With few rows a weight is used for little arithmetic per byte, and it comes from
// L3 or memory (a forward reads every weight once): the kernel prefetches the next
// chunk (the next panel's first after the last, contiguous in [N / PW][K][PW]) into
// L2 while it works on this one, its cache lines spread evenly over the chunk's
// iterations (every group, every k) so that the requests stream at the pace of the
// arithmetic. Up to kFewRowsMax rows a thread runs its panels one by one, each in
// blocks of kFewRows rows (the panel is read from memory by the first block, from L2
// by the next). Measured on AMD EPYC Zen 4, 2 threads, the GEMMs of a forward in
// sequence (benchmarks/experiments/few_rows_stream.py), ms, this kernel / oneDNN: all-MiniLM-L6-v2
// 16 rows 1.81 / 2.56 (2.33 before the prefetch), 64 rows 6.52 / 7.17, 128 rows
// 12.8 / 13.3, 256 rows 25.4 / 25.6, 512 rows 52.9 / 52.0; BERT-base 16 rows 13.5 /
// 17.6 (17.1 before), 64 rows 50.0 / 52.9 (59.3 on the row-block kernel), 128 rows
// 102.6 / 104.9, 256 rows 203.6 / 198.7.
constexpr int64_t kFewRows = 64;
constexpr int64_t kFewRowsMax = 128;
// AVX2 takes its few-rows kernel (gemm_tile_few_rows_sliced) up to 64 rows: above, the
// totals of every row (rows x 64 floats) and the chunk no longer share L1, and oneDNN
// is level or ahead. Measured on AMD EPYC Zen 3, AVX2, 2 threads,
// benchmarks/experiments/few_rows_stream.py --model minilm, oneDNN / this kernel for a
// forward's GEMMs (one run; benchmarks/results/cpu-amd-epyc-avx2-2t/few-rows-6x16.md):
// 1 row 1.55, 16 rows 1.42, 32 rows 1.29, 48 rows 1.27, 64 rows 1.07, 96 and 128 rows
// 0.97-0.98. With the earlier 4 x 16 tile and a prefetch loop in every k step the
// kernel ran at 37 % of the FMA ceiling with the weights in cache, and oneDNN was
// ahead from 24 rows on (0.81 at 24, 0.78 at 32).
constexpr int64_t kFewRowsMaxAvx2 = 64;

template <typename V, int VL, int MR, int NV, int ACT>
BF_INLINE void gemm_tile_few_rows(const float* BF_RESTRICT x, const float* BF_RESTRICT packed,
                                  const float* BF_RESTRICT bias, float* BF_RESTRICT out, int64_t M,
                                  int64_t N, int64_t K, int64_t p) {
  constexpr int PW = VL * NV;
  const int64_t n0 = p * PW;
  const float* BF_RESTRICT bp = packed + p * K * PW;
  const int64_t ncols = N - n0 < PW ? N - n0 : PW;
  const int64_t groups = (M + MR - 1) / MR;
  constexpr int64_t kChunkLines = KC * PW * sizeof(float) / 64;       // 64-byte lines per chunk
  const int64_t per_iter = (kChunkLines / KC + groups - 1) / groups;  // lines prefetched per k
  alignas(64) float total[kFewRows + MR][PW];
  for (int64_t g = 0; g < groups * MR; ++g)
    for (int j = 0; j < PW; ++j) total[g][j] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t k1 = k0 + KC < K ? k0 + KC : K;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i0 = g * MR;
      const float* a[MR];
      for (int r = 0; r < MR; ++r) a[r] = x + (i0 + r < M ? i0 + r : M - 1) * K;
      V acc[MR][NV];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = V{};
      const float* BF_RESTRICT b = bp + k0 * PW;
      // the next chunk's address (a hint: never faults, even past the buffer's end)
      const uintptr_t next = reinterpret_cast<uintptr_t>(bp + k0 * PW) + KC * PW * sizeof(float);
      for (int64_t k = k0; k < k1; ++k, b += PW) {
        const int64_t line = (g * KC + (k - k0)) * per_iter;
        for (int64_t l = line; l < line + per_iter && l < kChunkLines; ++l)
          __builtin_prefetch(reinterpret_cast<const void*>(next + l * 64), /*rw=*/0,
                             /*locality=*/2);
        fma_step<V, VL, MR, NV>(acc, a, k, b);
      }
      add_chunk<V, VL, MR, NV>(&total[i0][0], acc);
    }
  }
  store_rows<ACT>(&total[0][0], PW, bias, out, M, N, n0, ncols);
}

// A K chunk's register sums added into rows of `total` that are `stride` floats apart.
template <typename V, int VL, int MR, int NV>
BF_INLINE void add_chunk_rows(float* BF_RESTRICT total, int64_t stride, const V (&acc)[MR][NV]) {
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      V t = load_v<V>(total + r * stride + v * VL) + acc[r][v];
      std::memcpy(total + r * stride + v * VL, &t, sizeof(V));
    }
}

// gemm_tile_few_rows for a register tile narrower than the panel (AVX2: 16 ymm
// registers hold at most 6 rows x 16 columns of sums, not a 64-wide panel's row): the
// same chunk-outer order, each KC-deep chunk of the panel read from L3 / memory once
// and then from L1 by every group of rows x every TW-column slice of the panel. Sums
// are formed as in gemm_tile (per chunk in registers, chunks added in order): the same
// results as the row-block kernel, whatever the groups' heights. PW: a multiple of TW,
// at most 64.
//
// Row groups (few_rows_groups): 6 rows where they fill, else 4 or 5. A k step of a
// g-row group costs max(g, 4) cycles of FMAs: 2 FMAs a cycle, and each of the 2g sums
// waits 4 cycles for its last FMA. So 8 rows run as 4 + 4 (8 cycles a step), not as
// 6 + 6 with 4 rows computed and dropped (12), and 1 to 3 rows as one 4-row group.
// Measured against 6-row groups only (AMD EPYC Zen 3, 2 threads, a MiniLM forward's 24
// GEMMs, the two alternating in one process; benchmarks/results/cpu-amd-epyc-avx2-2t/
// few-rows-groups.md): one layer's weights in cache, 1-4 rows 1.35-1.38x, 7-9 rows
// 1.19-1.26x, 13-14 rows 1.08-1.12x, 10, 12, 16 and 20 rows level; six layers' weights
// streaming from memory, level at every row count (memory is the limit there).
//
// The next chunk is prefetched one cache line per k step of the chunk's first passes
// (a chunk row is PW / 16 lines, and there are at least PW / TW passes: the slices of
// the first group), so the requests go out at the pace of the arithmetic; the other
// passes run the bare loop (no per-step bookkeeping: at 16 rows this kernel ran at
// 37 % of the FMA ceiling with it).
constexpr int64_t kFewMaxPW = 64;

// One group of MR rows (from row i0; rows past M repeat row M - 1 and are dropped) over
// every slice of one chunk [k0, k1) of the panel; `step` numbers the passes from the
// chunk's first (a pass below prefetch_passes prefetches one line of the next chunk a
// step).
template <typename V, int VL, int MR, int NV>
BF_INLINE void few_rows_group(const float* BF_RESTRICT x, int64_t M, int64_t K, int64_t i0,
                              const float* BF_RESTRICT chunk, int64_t PW, int64_t k0, int64_t k1,
                              const char* next, int64_t step, int64_t prefetch_passes,
                              float (*total)[kFewMaxPW]) {
  constexpr int TW = VL * NV;
  const float* a[MR];
  for (int r = 0; r < MR; ++r) a[r] = x + (i0 + r < M ? i0 + r : M - 1) * K;
  for (int64_t s = 0; s < PW / TW; ++s, ++step) {
    V acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = V{};
    const float* BF_RESTRICT b = chunk + s * TW;
    if (step < prefetch_passes) {
      const char* line = next + step * KC * 64;
      for (int64_t k = k0; k < k1; ++k, b += PW, line += 64) {
        __builtin_prefetch(line, /*rw=*/0, /*locality=*/2);
        fma_step<V, VL, MR, NV>(acc, a, k, b);
      }
    } else {
      for (int64_t k = k0; k < k1; ++k, b += PW) fma_step<V, VL, MR, NV>(acc, a, k, b);
    }
    add_chunk_rows<V, VL, MR, NV>(&total[i0][s * TW], kFewMaxPW, acc);
  }
}

// The heights of the row groups of M rows (at most kFewRows): 6s, then the rest as one
// group of 4 or 5, or, where it is 1 to 3 rows, the last 6 and it as two groups of 4
// or 5 (7 -> 4 + 4 with 3 rows in the second, 8 -> 4 + 4, 9 -> 5 + 4). Returns the
// count; heights[i] is 4, 5 or 6 (a group may hold fewer real rows than its height
// only when M < 4 or M = 7).
inline int few_rows_groups(int64_t M, int (&heights)[kFewRows / 4 + 1]) {
  int n = 0;
  if (M <= 6) {
    heights[n++] = M <= 4 ? 4 : static_cast<int>(M);
    return n;
  }
  int64_t sixes = M / 6, rest = M % 6;
  if (rest >= 1 && rest <= 3) {
    --sixes;
    rest += 6;  // 7 to 9 rows: two groups
  }
  for (int64_t i = 0; i < sixes; ++i) heights[n++] = 6;
  if (rest >= 7) {
    heights[n++] = static_cast<int>(rest - 4 > 4 ? rest - 4 : 4);
    heights[n++] = 4;
  } else if (rest) {
    heights[n++] = static_cast<int>(rest);
  }
  return n;
}

template <typename V, int VL, int NV, int ACT>
BF_INLINE void gemm_tile_few_rows_sliced(const float* BF_RESTRICT x,
                                         const float* BF_RESTRICT packed,
                                         const float* BF_RESTRICT bias, float* BF_RESTRICT out,
                                         int64_t M, int64_t N, int64_t K, int64_t PW, int64_t p) {
  constexpr int TW = VL * NV;
  static_assert(TW == 16, "one prefetched line per k step needs a 16-float slice");
  const int64_t n0 = p * PW;
  const float* BF_RESTRICT bp = packed + p * K * PW;
  const int64_t ncols = N - n0 < PW ? N - n0 : PW;
  const int64_t slices = PW / TW;
  const int64_t prefetch_passes = PW / 16;  // lines per chunk row; <= slices <= passes
  int heights[kFewRows / 4 + 1];
  const int groups = few_rows_groups(M, heights);
  int64_t rows = 0;  // M, and the rows a group computes past it
  for (int g = 0; g < groups; ++g) rows += heights[g];
  alignas(64) float total[kFewRows + 6][kFewMaxPW];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < PW; ++j) total[r][j] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t k1 = k0 + KC < K ? k0 + KC : K;
    // the next chunk (the next panel's first after the last: [N / PW][K][PW] is
    // contiguous); a hint, which never faults, even past the buffer's end
    const char* next = reinterpret_cast<const char*>(bp + k1 * PW);
    const float* BF_RESTRICT chunk = bp + k0 * PW;
    int64_t i0 = 0;
    for (int g = 0; g < groups; ++g) {
      const int64_t step = g * slices;
      if (heights[g] == 6) {
        few_rows_group<V, VL, 6, NV>(x, M, K, i0, chunk, PW, k0, k1, next, step, prefetch_passes,
                                     total);
      } else if (heights[g] == 5) {
        few_rows_group<V, VL, 5, NV>(x, M, K, i0, chunk, PW, k0, k1, next, step, prefetch_passes,
                                     total);
      } else {
        few_rows_group<V, VL, 4, NV>(x, M, K, i0, chunk, PW, k0, k1, next, step, prefetch_passes,
                                     total);
      }
      i0 += heights[g];
    }
  }
  store_rows<ACT>(&total[0][0], kFewMaxPW, bias, out, M, N, n0, ncols);
}

// The AVX2 few-rows tile: register tiles of 4 to 6 rows x 16 columns (8 to 12 of the 16
// ymm registers hold sums) over each 16-column slice of the panel. Each sum is formed
// as in the row-block kernel (tile_avx2, 4 x 16), the same FMAs in the same order, so
// the results are equal.
template <int ACT>
__attribute__((noinline)) void tile_few_rows_avx2(const float* x, const float* packed,
                                                  const float* bias, float* out, int64_t M,
                                                  int64_t N, int64_t K, int64_t PW, int64_t p) {
  gemm_tile_few_rows_sliced<v8f, 8, 2, ACT>(x, packed, bias, out, M, N, K, PW, p);
}

template <int ACT>
__attribute__((target("arch=x86-64-v4"))) __attribute__((noinline)) void tile_few_rows_avx512(
    const float* x, const float* packed, const float* bias, float* out, int64_t M, int64_t N,
    int64_t K, int64_t PW, int64_t p) {
  if (PW == 64) {
    gemm_tile_few_rows<v16f, 16, 4, 4, ACT>(x, packed, bias, out, M, N, K, p);
  } else {  // PW == 32
    gemm_tile_few_rows<v16f, 16, 8, 2, ACT>(x, packed, bias, out, M, N, K, p);
  }
}

template <int NR>
void pack_weight(const float* w, float* packed, int64_t N, int64_t K, int num_threads) {
  const int64_t panels = (N + NR - 1) / NR;
  const int nt = threads_for(N * K, 1 << 16, num_threads);
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = packed + p * K * NR;
    for (int c = 0; c < NR; ++c) {
      const int64_t n = p * NR + c;
      if (n < N) {
        const float* src = w + n * K;
        for (int64_t k = 0; k < K; ++k) dst[k * NR + c] = src[k];
      } else {
        for (int64_t k = 0; k < K; ++k) dst[k * NR + c] = 0.0f;
      }
    }
  }
}

// Per-tile entry points, one per instruction set. The OpenMP loop stays outside
// them (an outlined parallel region would not inherit the target attribute).
template <int ACT>
__attribute__((target("arch=x86-64-v4"))) __attribute__((noinline)) void tile_avx512(
    const float* x, const float* packed, const float* bias, float* out, int64_t M, int64_t N,
    int64_t K, int64_t PW, int64_t mb, int64_t p) {
  gemm_tile<v16f, 16, 8, 2, ACT>(x, packed, bias, out, M, N, K, PW, mb, p);
}

template <int ACT>
__attribute__((noinline)) void tile_avx2(const float* x, const float* packed, const float* bias,
                                         float* out, int64_t M, int64_t N, int64_t K, int64_t PW,
                                         int64_t mb, int64_t p) {
  gemm_tile<v8f, 8, 4, 2, ACT>(x, packed, bias, out, M, N, K, PW, mb, p);
}

bool use_avx512(bool allow_avx512) {
#if defined(__GNUC__) && defined(__x86_64__)
  return allow_avx512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
  (void)allow_avx512;
  return false;
#endif
}

template <int ACT>
void gemm_packed(const float* x, const float* pk, const float* bias, float* out, int64_t M,
                 int64_t N, int64_t K, int64_t PW, bool avx512, int num_threads) {
  std::vector<float> zeros;
  if (!bias) {
    zeros.assign(N, 0.0f);
    bias = zeros.data();
  }
  const bool few_avx512 = avx512 && (PW == 32 || PW == 64);
  const bool few_avx2 = !avx512 && (PW == 16 || PW == 32 || PW == 64);
  if ((few_avx512 && M <= kFewRowsMax) || (few_avx2 && M <= kFewRowsMaxAvx2)) {
    const int64_t panels = (N + PW - 1) / PW;
    // streaming the weight is the work even at one row: threads as for 8 rows
    const int nt = threads_for((M > 8 ? M : 8) * N * K, 1 << 20, num_threads);
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t p = 0; p < panels; ++p)
      for (int64_t r0 = 0; r0 < M; r0 += kFewRows) {
        const int64_t rows = M - r0 < kFewRows ? M - r0 : kFewRows;
        if (avx512) {
          tile_few_rows_avx512<ACT>(x + r0 * K, pk, bias, out + r0 * N, rows, N, K, PW, p);
        } else {
          tile_few_rows_avx2<ACT>(x + r0 * K, pk, bias, out + r0 * N, rows, N, K, PW, p);
        }
      }
    return;
  }
  const int NR = avx512 ? 32 : 16;
  const int64_t panels = (N + NR - 1) / NR;
  const int64_t mblocks = (M + MB - 1) / MB;
  const int64_t tiles = panels * mblocks;
  // Tile order: row-block major while the packed weight is <= 8 MiB (it then stays
  // in L3 for every row block): each thread gets its own rows, so it faults in its
  // own pages of a fresh output and reuses its block of x from L2 across the
  // panels (QKV at 8192 tokens: 23 -> 18.5 ms per call). Beyond, panel major
  // (neighbours share a weight panel).
  const bool row_major = panels * NR * K <= (int64_t(1) << 21);
  const int nt = threads_for(M * N * K, 1 << 20, num_threads);
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t mb = row_major ? t / panels : t % mblocks;
    const int64_t p = row_major ? t % panels : t / mblocks;
    if (avx512) {
      tile_avx512<ACT>(x, pk, bias, out, M, N, K, PW, mb, p);
    } else {
      tile_avx2<ACT>(x, pk, bias, out, M, N, K, PW, mb, p);
    }
  }
}

}  // namespace

int linear_panel_width(bool allow_avx512) { return use_avx512(allow_avx512) ? 32 : 16; }

void linear_pack(void* packed, const void* weight, int64_t N, int64_t K, bool allow_avx512,
                 int num_threads) {
  if (N <= 0 || K <= 0) return;
  if (use_avx512(allow_avx512)) {
    pack_weight<32>(static_cast<const float*>(weight), static_cast<float*>(packed), N, K,
                    num_threads);
  } else {
    pack_weight<16>(static_cast<const float*>(weight), static_cast<float*>(packed), N, K,
                    num_threads);
  }
}

void linear_packed(void* out, const void* x, const void* packed, const void* bias, int64_t M,
                   int64_t N, int64_t K, int64_t panel_width, int activation, bool allow_avx512,
                   int num_threads) {
  if (M <= 0 || N <= 0) return;
  const float* xp = static_cast<const float*>(x);
  const float* pk = static_cast<const float*>(packed);
  const float* bp = static_cast<const float*>(bias);
  float* op = static_cast<float*>(out);
  advise_huge_pages(op, M * N * static_cast<int64_t>(sizeof(float)));
  const bool avx512 = use_avx512(allow_avx512);
  dispatch_activation</*kWithNone=*/true>(activation, [&](auto act_c) {
    gemm_packed<decltype(act_c)::value>(xp, pk, bp, op, M, N, K, panel_width, avx512, num_threads);
  });
}

void linear_act(void* out, const void* x, const void* weight, const void* bias, int64_t M,
                int64_t N, int64_t K, int activation, bool allow_avx512, int num_threads) {
  if (M <= 0 || N <= 0) return;
  const int NR = linear_panel_width(allow_avx512);
  std::vector<float> packed(((N + NR - 1) / NR) * NR * (K > 0 ? K : 0));
  linear_pack(packed.data(), weight, N, K, allow_avx512, num_threads);
  linear_packed(out, x, packed.data(), bias, M, N, K, NR, activation, allow_avx512, num_threads);
}

}  // namespace cpu
}  // namespace bertfast
