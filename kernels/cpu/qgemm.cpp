// int8 GEMM: uint8 activations (quantized per row at run time) x int8 weights
// (per-output-channel scales), int32 accumulation, fp32 epilogue (zero-point term,
// scales, bias, activation). Quantization formulas and the packed weight layout:
// kernels/cpu/qgemm.h.
//
// Micro-kernels, chosen per call (the caller resolves BERTFAST_CPU_INT8_ISA):
//   VNNI (AVX512-VNNI, vpdpbusd): MR = 6 rows x 64 columns (4 zmm accumulators per
//     row); per 4 k's one 64-byte load per 16 columns and one broadcast of 4
//     activation bytes per row.
//   AVX2 (baseline, exact): the same packed weights, 8 columns at a time, widened
//     to int16 (vpmovsxbw) and multiplied with vpmaddwd against the row's 4
//     activation bytes widened to int16: every product and pair sum is exact in
//     int32 (255 * 127 * 2 < 2^31); no vpmaddubsw, which saturates.
// Both give the same int32 accumulators bit for bit (integer sums are exact).
// Threads: OpenMP static split over (block of rows, 64-column panel) tiles, panel
// major up to 512 rows, row block major above (see run_tiles): MB rows for VNNI /
// AVX2, MB_AMX for AMX (see tile_amx).
#include "cpu/qgemm.h"

#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__AVX2__)
#include <cpuid.h>
#include <immintrin.h>
#define BF_QGEMM_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

#include "cpu/amx.h"
#define BF_QGEMM_AMX 1
#endif
#endif

#include "cpu/common.h"

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t MB = 48;                // rows per task for VNNI / AVX2 (a multiple of both MRs)
constexpr int64_t MB_AMX = 256;           // rows per task for AMX (a multiple of 16)
constexpr int64_t kPanelMajorRows = 512;  // see run_tiles
constexpr int kRawMode = -100;            // epilogue mode: write the raw int32 accumulators
constexpr int64_t kStep = kQPanel * 4;    // bytes of one panel per 4 k's

struct QArgs {
  const uint8_t* a;
  int64_t lda;
  const int8_t* packed;
  int64_t K4;  // padded K / 4
  int64_t M, N;
  int32_t* out32;  // raw mode
  float* out;      // fp32 mode
  const float* a_scale;
  const int32_t* a_zp;
  const int32_t* colsum;
  const float* w_scale;
  const float* bias;  // never null here
  int64_t mb_rows;    // rows per task (MB or MB_AMX)
  bool accumulate;    // fp32 mode: add the result to what out holds (before the activation)
};

// Rows [i0, i0 + rows) x columns [n0, n0 + ncols) from tmp [rows][kQPanel].
template <int MODE>
BF_INLINE void epilogue(const QArgs& q, const int32_t* tmp, int rows, int64_t i0, int64_t n0,
                        int64_t ncols) {
  for (int r = 0; r < rows; ++r) {
    const int32_t* t = tmp + r * kQPanel;
    const int64_t m = i0 + r;
    if constexpr (MODE == kRawMode) {
      int32_t* o = q.out32 + m * q.N + n0;
      for (int64_t j = 0; j < ncols; ++j) o[j] = t[j];
    } else {
      const float sx = q.a_scale[m];
      const int32_t zp = q.a_zp[m];
      const int32_t* cs = q.colsum + n0;
      const float* ws = q.w_scale + n0;
      const float* b = q.bias + n0;
      float* o = q.out + m * q.N + n0;
      if (q.accumulate) {
        for (int64_t j = 0; j < ncols; ++j)
          o[j] += static_cast<float>(t[j] - zp * cs[j]) * (sx * ws[j]) + b[j];
      } else {
        for (int64_t j = 0; j < ncols; ++j)
          o[j] = static_cast<float>(t[j] - zp * cs[j]) * (sx * ws[j]) + b[j];
      }
      if (MODE != kNoActivation) activate_inplace<float>(MODE, o, ncols);
    }
  }
}

BF_INLINE void tile_bounds(const QArgs& q, int64_t mb, int64_t p, int64_t& n0, int64_t& ncols,
                           int64_t& m_end) {
  n0 = p * kQPanel;
  ncols = q.N - n0 < kQPanel ? q.N - n0 : kQPanel;
  m_end = (mb + 1) * q.mb_rows < q.M ? (mb + 1) * q.mb_rows : q.M;
}

#ifdef BF_QGEMM_X86
template <int MODE>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
__attribute__((noinline)) void tile_vnni(const QArgs& q, int64_t mb, int64_t p) {
  constexpr int MR = 6, NV = 4;
  int64_t n0, ncols, m_end;
  tile_bounds(q, mb, p, n0, ncols, m_end);
  const int8_t* BF_RESTRICT bp = q.packed + p * q.K4 * kStep;
  alignas(64) int32_t tmp[MR * kQPanel];
  for (int64_t i0 = mb * q.mb_rows; i0 < m_end; i0 += MR) {
    const int rows = static_cast<int>(m_end - i0 < MR ? m_end - i0 : MR);
    const uint8_t* a[MR];
    for (int r = 0; r < MR; ++r) a[r] = q.a + (i0 + (r < rows ? r : rows - 1)) * q.lda;
    __m512i acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
    const int8_t* BF_RESTRICT b = bp;
    for (int64_t k4 = 0; k4 < q.K4; ++k4, b += kStep) {
      __m512i bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + 64 * v);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        int32_t a4;
        std::memcpy(&a4, a[r] + 4 * k4, 4);
        const __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, bv[v]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_store_si512(tmp + r * kQPanel + v * 16, acc[r][v]);
    epilogue<MODE>(q, tmp, rows, i0, n0, ncols);
  }
}

template <int MODE>
__attribute__((noinline)) void tile_avx2(const QArgs& q, int64_t mb, int64_t p) {
  constexpr int MR = 4;
  int64_t n0, ncols, m_end;
  tile_bounds(q, mb, p, n0, ncols, m_end);
  const int64_t Kp = q.K4 * 4;
  const int8_t* BF_RESTRICT bp = q.packed + p * q.K4 * kStep;
  // The rows' activations widened to int16 once per row group.
  thread_local std::vector<int16_t> widened;
  if (static_cast<int64_t>(widened.size()) < MR * Kp) widened.resize(MR * Kp);
  int16_t* aw = widened.data();
  alignas(64) int32_t tmp[MR * kQPanel];
  // The next panel (the next tile's in both tile orders of run_tiles), fetched into
  // cache a cache line per k-step during the first row group's first four column
  // sweeps, while this panel computes: the column sweeps read a panel with a 256-byte
  // stride, which the hardware prefetcher does not run far enough ahead of. MiniLM
  // int8 forwards, AMD EPYC Zen 3 (AVX2), 2 threads, with / without in one process,
  // alternating: 1.15-1.23x at 1-4 tokens, 1.04-1.06x at 16-64, 1.00 at 1024.
  const int8_t* next = n0 + kQPanel < q.N ? bp + q.K4 * kStep : nullptr;
  for (int64_t i0 = mb * q.mb_rows; i0 < m_end; i0 += MR) {
    const int rows = static_cast<int>(m_end - i0 < MR ? m_end - i0 : MR);
    for (int r = 0; r < MR; ++r) {
      const uint8_t* src = q.a + (i0 + (r < rows ? r : rows - 1)) * q.lda;
      int16_t* dst = aw + r * Kp;
      for (int64_t k = 0; k < Kp; ++k) dst[k] = src[k];
    }
    for (int64_t c0 = 0; c0 < ncols; c0 += 8) {
      __m256i lo[MR], hi[MR];
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
      const int8_t* BF_RESTRICT b = bp + c0 * 4;
      const int8_t* pf = next && i0 == mb * q.mb_rows && c0 < 32 ? next + c0 * 8 : nullptr;
      for (int64_t k4 = 0; k4 < q.K4; ++k4, b += kStep) {
        if (pf) _mm_prefetch(reinterpret_cast<const char*>(pf + k4 * kStep), _MM_HINT_T0);
        const __m256i bl =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
        const __m256i bh =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          int64_t a4;
          std::memcpy(&a4, aw + r * Kp + 4 * k4, 8);
          const __m256i av = _mm256_set1_epi64x(a4);
          lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(av, bl));
          hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(av, bh));
        }
      }
      // lo: columns c0..c0+3 as (k0+k1, k2+k3) pairs; hi: c0+4..c0+7.
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp + r * kQPanel + c0), s);
      }
    }
    epilogue<MODE>(q, tmp, rows, i0, n0, ncols);
  }
}
#ifdef BF_QGEMM_AMX
// AMX (tdpbusd). A task is up to MB_AMX rows x one 64-column panel. Tiles: int32
// sums 16 x 16 (tmm0-3), A 16 rows x 64 k (tmm4), B 16 k/4-rows x 16 columns x 4
// (tmm6-7, read straight from the packed panel with a 256-byte stride).
//   More than 16 rows: each 32-column half of the panel in turn (K x 32 bytes, 24 KB
//   at K = 768), and for every 16 rows of the task 1 x 2 tiles over the whole K (one
//   A tile, the half's two B tiles). The half is read from memory once and then
//   from cache for every 16 rows; the sums gather in tmp and the epilogue runs once
//   for the task. Against 2 x 2 tiles over both halves 32 rows at a time (A and B
//   48 KB together at K = 768, L1's size), measured on an Intel Xeon (Emerald
//   Rapids), 2 threads, whole int8 forwards alternating in one process, outputs
//   equal: BERT-base 1x128 1.22-1.26x, 8x128 1.23x; MiniLM 4x128 / 8x128
//   1.14-1.18x, 1x128 0.96-1.15x (noise); one thread, BERT-base 1x128 1.31x.
//   Up to 16 rows: 1 x 4 tiles over the whole panel (one A tile, four B tiles): the
//   rows' time is the panel's read from memory.
// Needs K % 64 == 0 and the A rows padded to a multiple of 16 (the caller's buffer;
// the extra rows are discarded), and the calling thread's tiles configured by
// amx_begin (run_tiles: once a call, not a task). AVX-512 for the epilogue (every
// AMX CPU has it).
template <int MODE>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
__attribute__((noinline)) void
tile_amx(const QArgs& q, int64_t mb, int64_t p) {
  int64_t n0, ncols, m_end;
  tile_bounds(q, mb, p, n0, ncols, m_end);
  const int8_t* bp = q.packed + p * q.K4 * kStep;
  const int64_t kblocks = q.K4 / 16;
  const int64_t lda = q.lda;
  const int64_t i_begin = mb * q.mb_rows;
  const int rows = static_cast<int>(m_end - i_begin);
  alignas(64) static thread_local int32_t tmp[MB_AMX * kQPanel];  // 64 KB
  if (rows > 16) {
    for (int h = 0; h < 2; ++h) {
      const int8_t* bh = bp + h * 128;
      for (int64_t i0 = i_begin; i0 < m_end; i0 += 16) {  // rows past m_end: padding
        const uint8_t* a = q.a + i0 * lda;
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t kb = 0; kb < kblocks; ++kb) {
          const int8_t* b = bh + kb * 16 * kStep;
          _tile_loadd(4, a + kb * 64, lda);
          _tile_loadd(6, b, kStep);
          _tile_dpbusd(0, 4, 6);
          _tile_loadd(7, b + 64, kStep);
          _tile_dpbusd(1, 4, 7);
        }
        int32_t* t = tmp + (i0 - i_begin) * kQPanel + h * 32;
        _tile_stored(0, t, kQPanel * 4);
        _tile_stored(1, t + 16, kQPanel * 4);
      }
    }
  } else {
    const uint8_t* a = q.a + i_begin * lda;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const int8_t* b = bp + kb * 16 * kStep;
      _tile_loadd(4, a + kb * 64, lda);
      _tile_loadd(6, b, kStep);
      _tile_dpbusd(0, 4, 6);
      _tile_loadd(7, b + 64, kStep);
      _tile_dpbusd(1, 4, 7);
      _tile_loadd(6, b + 128, kStep);
      _tile_dpbusd(2, 4, 6);
      _tile_loadd(7, b + 192, kStep);
      _tile_dpbusd(3, 4, 7);
    }
    _tile_stored(0, tmp, kQPanel * 4);
    _tile_stored(1, tmp + 16, kQPanel * 4);
    _tile_stored(2, tmp + 32, kQPanel * 4);
    _tile_stored(3, tmp + 48, kQPanel * 4);
  }
  epilogue<MODE>(q, tmp, rows, i_begin, n0, ncols);
}

// A thread's tiles for its tile_amx tasks of one call: configured before the first,
// released after the last. Once a task instead (ldtilecfg after tilerelease) was
// about a fifth of tile_amx's time at one row.
__attribute__((noinline)) void amx_begin() { amx_configure_16x64(8); }
__attribute__((noinline)) void amx_end() { asm volatile("tilerelease" ::); }

// Linux gives a process the AMX tile state only on request (once per process).
bool amx_enabled() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    const bool tile = (d >> 24) & 1u, int8 = (d >> 25) & 1u;
    if (!tile || !int8) return;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    ok = syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  });
  return ok;
}
#endif  // BF_QGEMM_AMX
#endif  // BF_QGEMM_X86

// Portable scalar kernel (builds without AVX2 only).
template <int MODE>
__attribute__((noinline)) void tile_scalar(const QArgs& q, int64_t mb, int64_t p) {
  int64_t n0, ncols, m_end;
  tile_bounds(q, mb, p, n0, ncols, m_end);
  const int8_t* bp = q.packed + p * q.K4 * kStep;
  int32_t tmp[kQPanel];
  for (int64_t m = mb * q.mb_rows; m < m_end; ++m) {
    for (int64_t c = 0; c < ncols; ++c) {
      int32_t s = 0;
      for (int64_t k4 = 0; k4 < q.K4; ++k4)
        for (int j = 0; j < 4; ++j)
          s += int32_t(q.a[m * q.lda + 4 * k4 + j]) * int32_t(bp[k4 * kStep + c * 4 + j]);
      tmp[c] = s;
    }
    epilogue<MODE>(q, tmp, 1, m, n0, ncols);
  }
}

void quantize_row(uint8_t* BF_RESTRICT q, float* scale_out, int32_t* zp_out,
                  const float* BF_RESTRICT x, int64_t K, int64_t ldq, bool wide);

template <int MODE>
BF_INLINE void run_tile(const QArgs& q, int isa, int64_t mb, int64_t p) {
#ifdef BF_QGEMM_X86
  if (isa == kQIsaAmx) {
#ifdef BF_QGEMM_AMX
    tile_amx<MODE>(q, mb, p);
#endif
  } else if (isa == kQIsaVnni) {
    tile_vnni<MODE>(q, mb, p);
  } else {
    tile_avx2<MODE>(q, mb, p);
  }
#else
  (void)isa;
  tile_scalar<MODE>(q, mb, p);
#endif
}

// With x: its rows are quantized into q's activation buffers (q.a, q.a_scale, q.a_zp)
// first, in the same parallel region (one fork/join per linear layer). With second
// (x required): what those rows miss, r = x - (q - zp) * scale, is quantized per row
// into second's buffers, and each tile runs q (no bias, no activation) and then
// second (accumulating, bias, MODE) on the same thread while the tile is in cache.
template <int MODE>
void run_tiles(const QArgs& q, int isa, int num_threads, const float* x = nullptr, int64_t K = 0,
               const QArgs* second = nullptr) {
  const int64_t panels = (q.N + kQPanel - 1) / kQPanel;
  const int64_t mblocks = (q.M + q.mb_rows - 1) / q.mb_rows;
  const int64_t tiles = panels * mblocks;
  // Multiply-adds per thread worth a thread (fork/join and a peer that is not
  // scheduled cost more than a small GEMM on AMX takes).
  const int64_t grain = isa == kQIsaAmx ? (1 << 24) : isa == kQIsaVnni ? (1 << 22) : (1 << 20);
  // A few rows' GEMM streams its weight from L3 or memory, and that read is what a
  // second thread shares: each weight byte counts as `weight_rows` rows'
  // multiply-adds. MiniLM int8, 2 threads, forwards with / without in one process:
  // AVX2 (32), AMD EPYC Zen 3: 1x1 1.44x (every GEMM had run on one thread), 1x8
  // 1.07x over a count of 8 rows; AMX (64), Intel Xeon (Emerald Rapids): 1x1 1.22x,
  // 1x8 1.22x, 1x16 1.29x, 1x32 to 1x128 1.00-1.03x over no count.
  const int64_t weight_rows = isa == kQIsaAvx2 ? 32 : isa == kQIsaAmx ? 64 : 0;
  const int nt =
      threads_for((q.M + weight_rows) * q.N * q.K4 * 4 * (second ? 2 : 1), grain, num_threads);
  (void)nt;
  // Tile order: panel major up to kPanelMajorRows rows (a thread takes whole panels,
  // every row block of one before the next: each weight panel comes from memory once,
  // the few rows' activations stay in L2), row-block major above (the activations
  // no longer fit). Measured on AMD EPYC Zen 4 (VNNI), 2 threads, the 48 GEMMs of a
  // BERT-base forward in sequence, ms, row-block / panel major: 128 rows 40.7 /
  // 36.9, 256 rows 74.8 / 66.2, 512 rows 133.6 / 132.0, 1024 rows 276 / 277, 4096
  // rows 1057 / 1078.
  const bool panel_major = q.M <= kPanelMajorRows;
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#endif
  {
#ifdef BF_QGEMM_AMX
    if (isa == kQIsaAmx) amx_begin();
#endif
    if (x) {
      uint8_t* qa = const_cast<uint8_t*>(q.a);
      float* sx = const_cast<float*>(q.a_scale);
      int32_t* zp = const_cast<int32_t*>(q.a_zp);
      const bool wide = isa != kQIsaAvx2;  // AVX-512 quantization (VNNI / AMX CPUs)
      thread_local std::vector<float> resid;
      if (second && static_cast<int64_t>(resid.size()) < K) resid.resize(K);
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t m = 0; m < q.M; ++m) {
        uint8_t* qrow = qa + m * q.lda;
        const float* xrow = x + m * K;
        quantize_row(qrow, sx + m, zp + m, xrow, K, q.lda, wide);
        if (second) {
          const float s = sx[m];
          const int32_t z = zp[m];
          float* r = resid.data();
          for (int64_t k = 0; k < K; ++k)
            r[k] = xrow[k] - static_cast<float>(static_cast<int32_t>(qrow[k]) - z) * s;
          quantize_row(const_cast<uint8_t*>(second->a) + m * q.lda,
                       const_cast<float*>(second->a_scale) + m,
                       const_cast<int32_t*>(second->a_zp) + m, r, K, q.lda, wide);
        }
      }
    }
    const auto tile = [&](int64_t t) {
      const int64_t mb = panel_major ? t % mblocks : t / panels;
      const int64_t p = panel_major ? t / mblocks : t % panels;
      if (second) {
        run_tile<kNoActivation>(q, isa, mb, p);
        run_tile<MODE>(*second, isa, mb, p);
      } else {
        run_tile<MODE>(q, isa, mb, p);
      }
    };
    share_tasks(tiles, /*guided=*/mblocks >= 2, tile);  // common.h: why guided
#ifdef BF_QGEMM_AMX
    if (isa == kQIsaAmx) amx_end();
#endif
  }
}

#ifdef BF_QGEMM_X86
// AVX-512 bulk of quantize_row's two passes (k < K rounded down to 16); the
// AVX2 / scalar code finishes the row. Same values bit for bit: min / max are exact
// in any order, `bad` only needs to become NaN, and the rounding is the same.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) int64_t
minmax_avx512(const float* BF_RESTRICT x, int64_t K, float& lo, float& hi, float& bad) {
  __m512 vlo = _mm512_setzero_ps(), vhi = vlo, vbad = vlo;
  const __m512 zero = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    vlo = _mm512_min_ps(vlo, v);
    vhi = _mm512_max_ps(vhi, v);
    vbad = _mm512_add_ps(vbad, _mm512_mul_ps(v, zero));
  }
  const float l = _mm512_reduce_min_ps(vlo), h = _mm512_reduce_max_ps(vhi);
  lo = l < lo ? l : lo;
  hi = h > hi ? h : hi;
  bad += _mm512_reduce_add_ps(vbad);
  return k;
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) int64_t
quantize_avx512(uint8_t* BF_RESTRICT q, const float* BF_RESTRICT x, int64_t K, float inv, float qlo,
                float qhi, int32_t zp) {
  const __m512 vinv = _mm512_set1_ps(inv), vqlo = _mm512_set1_ps(qlo), vqhi = _mm512_set1_ps(qhi);
  const __m512i vzp = _mm512_set1_epi32(zp);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + k), vinv);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, vqlo), vqhi);
    const __m512i i = _mm512_add_epi32(_mm512_cvttps_epi32(v), vzp);  // [0, 255]
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(i));
  }
  return k;
}
#endif

// One row: see the formulas in qgemm.h. wide: the CPU has AVX-512 (F/BW/DQ/VL).
void quantize_row(uint8_t* BF_RESTRICT q, float* scale_out, int32_t* zp_out,
                  const float* BF_RESTRICT x, int64_t K, int64_t ldq, bool wide) {
  float lo = 0.0f, hi = 0.0f, bad = 0.0f;  // bad: NaN when x holds NaN or +-inf
  int64_t k = 0;
#ifdef BF_QGEMM_X86
  if (wide) k = minmax_avx512(x, K, lo, hi, bad);
  {
    __m256 vlo = _mm256_setzero_ps(), vhi = vlo, vbad = vlo;
    const __m256 zero = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
      const __m256 v = _mm256_loadu_ps(x + k);
      vlo = _mm256_min_ps(vlo, v);
      vhi = _mm256_max_ps(vhi, v);
      vbad = _mm256_add_ps(vbad, _mm256_mul_ps(v, zero));
    }
    alignas(32) float l[8], h[8], b[8];
    _mm256_store_ps(l, vlo);
    _mm256_store_ps(h, vhi);
    _mm256_store_ps(b, vbad);
    for (int i = 0; i < 8; ++i) {
      lo = l[i] < lo ? l[i] : lo;
      hi = h[i] > hi ? h[i] : hi;
      bad += b[i];
    }
  }
#else
  (void)wide;
#endif
  for (; k < K; ++k) {
    lo = x[k] < lo ? x[k] : lo;
    hi = x[k] > hi ? x[k] : hi;
    bad += x[k] * 0.0f;
  }
  if (bad != bad) {
    *scale_out = std::numeric_limits<float>::quiet_NaN();
    *zp_out = 0;
    std::memset(q, 0, static_cast<size_t>(ldq));
    return;
  }
  float scale = hi / 255.0f - lo / 255.0f;
  scale = scale > 0x1p-100f ? scale : 0x1p-100f;
  const float inv = 1.0f / scale;
  float zpf = std::nearbyint(-lo * inv);
  zpf = zpf < 0.0f ? 0.0f : (zpf > 255.0f ? 255.0f : zpf);
  const int32_t zp = static_cast<int32_t>(zpf);
  const float qlo = -zpf, qhi = 255.0f - zpf;
  *scale_out = scale;
  *zp_out = zp;
  k = 0;
#ifdef BF_QGEMM_X86
  if (wide) k = quantize_avx512(q, x, K, inv, qlo, qhi, zp);
  {
    const __m256 vinv = _mm256_set1_ps(inv), vqlo = _mm256_set1_ps(qlo), vqhi = _mm256_set1_ps(qhi);
    const __m256i vzp = _mm256_set1_epi32(zp);
    for (; k + 8 <= K; k += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + k), vinv);
      v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm256_min_ps(_mm256_max_ps(v, vqlo), vqhi);
      const __m256i i = _mm256_add_epi32(_mm256_cvttps_epi32(v), vzp);  // [0, 255]
      const __m256i w = _mm256_packus_epi32(i, i);
      const __m256i bytes = _mm256_packus_epi16(w, w);
      const int32_t b0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(bytes));
      const int32_t b1 = _mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1));
      std::memcpy(q + k, &b0, 4);
      std::memcpy(q + k + 4, &b1, 4);
    }
  }
#endif
  for (; k < K; ++k) {
    float v = std::nearbyint(x[k] * inv);
    v = v < qlo ? qlo : (v > qhi ? qhi : v);
    q[k] = static_cast<uint8_t>(static_cast<int32_t>(v) + zp);
  }
  for (k = K; k < ldq; ++k) q[k] = 0;
}

}  // namespace

bool qgemm_cpu_has_avx2() {
#if defined(BF_QGEMM_X86)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool qgemm_cpu_has_amx() {
#if defined(BF_QGEMM_AMX)
  return qgemm_cpu_has_vnni() && amx_enabled();
#else
  return false;
#endif
}

int qgemm_isa_for(int isa, int64_t K) { return isa == kQIsaAmx && K % 64 != 0 ? kQIsaVnni : isa; }

bool qgemm_cpu_has_vnni() {
#if defined(BF_QGEMM_X86)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

void quantize_rows(uint8_t* q, float* scale, int32_t* zp, const float* x, int64_t M, int64_t K,
                   int64_t ldq, int num_threads) {
  const int nt = threads_for(M * K, 1 << 16, num_threads);
  (void)nt;
  const bool wide = qgemm_cpu_has_vnni();
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t m = 0; m < M; ++m)
    quantize_row(q + m * ldq, scale + m, zp + m, x + m * K, K, ldq, wide);
}

void qgemm_pack(int8_t* packed, int32_t* colsum, const int8_t* w, int64_t N, int64_t K,
                int num_threads) {
  const int64_t K4 = qgemm_padded_k(K) / 4;
  const int64_t panels = (N + kQPanel - 1) / kQPanel;
  const int nt = threads_for(N * K, 1 << 16, num_threads);
  (void)nt;
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t p = 0; p < panels; ++p) {
    int8_t* dst = packed + p * K4 * kStep;
    for (int64_t c = 0; c < kQPanel; ++c) {
      const int64_t n = p * kQPanel + c;
      int32_t s = 0;
      for (int64_t k4 = 0; k4 < K4; ++k4)
        for (int j = 0; j < 4; ++j) {
          const int64_t k = 4 * k4 + j;
          const int8_t v = (n < N && k < K) ? w[n * K + k] : int8_t(0);
          dst[k4 * kStep + c * 4 + j] = v;
          s += v;
        }
      colsum[n] = s;
    }
  }
}

void qgemm_s32(int32_t* out, const uint8_t* a, int64_t lda, const int8_t* packed, int64_t M,
               int64_t N, int64_t K, int isa, int num_threads) {
  if (M <= 0 || N <= 0) return;
  isa = qgemm_isa_for(isa, K);
  advise_huge_pages(out, M * N * static_cast<int64_t>(sizeof(int32_t)));
  thread_local std::vector<uint8_t> padded;
  const int64_t M16 = (M + 15) / 16 * 16;
  if (isa == kQIsaAmx && M16 != M && lda > 0) {  // AMX reads whole 16-row tiles
    padded.assign(M16 * lda, 0);
    std::memcpy(padded.data(), a, static_cast<size_t>(M * lda));
    a = padded.data();
  }
  QArgs q{};
  q.a = a;
  q.lda = lda;
  q.packed = packed;
  q.K4 = qgemm_padded_k(K) / 4;
  q.M = M;
  q.N = N;
  q.out32 = out;
  q.mb_rows = isa == kQIsaAmx ? MB_AMX : MB;
  run_tiles<kRawMode>(q, isa, num_threads);
}

namespace {
// A calling thread's activation buffers for one part (the GIL is released: several
// Python threads may call): uint8 rows padded to 16 rows for AMX, scales, zero points.
struct QuantBuffers {
  std::vector<uint8_t> qa;
  std::vector<float> sx;
  std::vector<int32_t> zp;
  void reserve(int64_t M, int64_t Kp, bool amx) {
    const int64_t M16 = (M + 15) / 16 * 16;  // AMX reads whole 16-row tiles
    if (static_cast<int64_t>(qa.size()) < M16 * Kp) qa.resize(M16 * Kp);
    if (amx && M16 != M && Kp > 0)
      std::memset(qa.data() + M * Kp, 0, static_cast<size_t>((M16 - M) * Kp));
    if (static_cast<int64_t>(sx.size()) < M) {
      sx.resize(M);
      zp.resize(M);
    }
  }
};
}  // namespace

void qlinear(float* out, const float* x, const int8_t* packed, const int32_t* colsum,
             const float* w_scale, const float* bias, int64_t M, int64_t N, int64_t K,
             int activation, int isa, int num_threads, bool split) {
  if (M <= 0 || N <= 0) return;
  isa = qgemm_isa_for(isa, K);
  advise_huge_pages(out, M * N * static_cast<int64_t>(sizeof(float)));
  const int64_t Kp = qgemm_padded_k(K);
  thread_local QuantBuffers parts[2];
  thread_local std::vector<float> zeros;
  parts[0].reserve(M, Kp, isa == kQIsaAmx);
  if (split) parts[1].reserve(M, Kp, isa == kQIsaAmx);
  if (static_cast<int64_t>(zeros.size()) < N) zeros.assign(N, 0.0f);
  QArgs q{};
  q.lda = Kp;
  q.packed = packed;
  q.K4 = Kp / 4;
  q.M = M;
  q.N = N;
  q.out = out;
  q.colsum = colsum;
  q.w_scale = w_scale;
  q.mb_rows = isa == kQIsaAmx ? MB_AMX : MB;
  QArgs q1 = q, q2 = q;
  q1.a = parts[0].qa.data();
  q1.a_scale = parts[0].sx.data();
  q1.a_zp = parts[0].zp.data();
  q1.bias = split || !bias ? zeros.data() : bias;
  if (split) {
    q2.a = parts[1].qa.data();
    q2.a_scale = parts[1].sx.data();
    q2.a_zp = parts[1].zp.data();
    q2.bias = bias ? bias : zeros.data();
    q2.accumulate = true;
  }
  dispatch_activation</*kWithNone=*/true>(activation, [&](auto act_c) {
    run_tiles<decltype(act_c)::value>(q1, isa, num_threads, x, K, split ? &q2 : nullptr);
  });
}

}  // namespace cpu
}  // namespace bertfast
