// The bf16 micro-kernels of the CPU attention (driver: attention.cpp), for bf16
// storage on a CPU with AVX512-BF16 (x86-64 only; elsewhere this file is empty):
// Q K^T and P V on AMX tiles (tdpbf16ps, where the CPU has amx_bf16 and Linux grants
// the tile state) or else vdpbf16ps: bf16 products, exact in fp32, summed in fp32;
// the operands kept in bf16 in scratch, laid out in pairs along the reduction
// dimension as both instructions read them. The scale is applied to the fp32
// scores, the softmax statistics (max, sum) are fp32, and P is rounded to bf16
// (round to nearest even, relative error <= 2^-9) before P V; the row sum l is
// taken over the rounded P, so the weights applied to V sum to 1 in fp32.
//
// A task's real keys are selected as in the fp32-math path (attention_fp32.cpp):
// masked keys are left out, padded query rows written as zeros.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/attention_internal.h"
#include "cpu/common.h"
#include "cpu/kernels.h"

#ifdef BF_X86
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu/amx.h"
#define BF_AMX_LINUX 1
#endif

namespace bertfast {
namespace cpu {
namespace attn {
namespace {

// vdpbf16ps: acc[i] += a[2i] * b[2i] + a[2i+1] * b[2i+1] (16 fp32 lanes, bf16 pairs).
// Layouts, in 32-bit words each holding a bf16 pair along the reduction dimension
// (dp = ceil(d / 2) pairs of head dims; an odd head_dim is padded with a zero):
//   q2 [ROWS][dp]                       (q[2p], q[2p + 1])
//   kt2 [key blocks][dp][BLOCK_N]       (k[j][2p], k[j][2p + 1])  one key per word
//   v2 [key pairs][dpad]                (v[2i][dd], v[2i + 1][dd])
//   p16 [ROWS][BLOCK_N] bf16, read as words (p[2i], p[2i + 1])
// so each micro-kernel step broadcasts one word of Q (or P) per row against 16 words
// of K (or V). Keys past the real ones are zero in kt2 / v2 and get p = 0.
#define BF_BF16_TARGET __attribute__((target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")))

// 2^t for the softmax of the bf16 paths, whose arguments are <= 0 (a scaled score
// minus the running max, in units of ln 2) or NaN: 2^n * 2^f with n = round(t) and f =
// t - n in [-1/2, 1/2], 2^f by its Taylor series to degree 5 (relative truncation
// < 3e-6, far below the 2^-9 of the rounding to bf16 that follows), 2^n applied by
// vscalefps. Exactly 0 below 2^-125 (no subnormal p; exp(-inf) == 0), NaN for NaN.
BF_BF16_TARGET BF_INLINE __m512 exp2_softmax(__m512 t) {
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146428443e-3f);  // ln2^k / k!, k = 5 .. 0
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// One row of the bf16 paths' online softmax over the raw scores s of `valid` keys: the
// scaled scores s * scale (those from valid up to w, the next multiple of 32, taken
// as -inf after the scaling, whatever the scale's sign), their max joined to the
// running max m, p = exp(s * scale - m) rounded to bf16 into pb (nearest even; NaN
// stays NaN; p = 0 past valid), and the running sum l rescaled and increased by the
// sum of the rounded p. Returns alpha = exp(m_old - m_new), the factor for what was
// accumulated before. The max is taken over the raw scores when scale is positive and
// finite (rounding s * scale is monotonic in s, so the max is the same number), and
// exp's argument is one fma, s * (scale log2 e) - m log2 e. Non-finite scores and
// scales propagate as in softmax_step (attention_internal.h); _mm512_max_ps(a, b) is
// a > b ? a : b, as fmax_.
BF_BF16_TARGET BF_INLINE float softmax_row_bf16(const float* BF_RESTRICT s, int64_t valid,
                                                float scale, float& m, float& l,
                                                uint16_t* BF_RESTRICT pb) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t w = (valid + 31) / 32 * 32;
  const __m512 ninf = _mm512_set1_ps(-kInf);
  const auto lanes = [valid](int64_t j) {  // the real keys among the 16 from j
    return j + 16 <= valid ? __mmask16(0xffff)
           : j < valid     ? __mmask16((1u << (valid - j)) - 1)
                           : __mmask16(0);
  };
  __m512 vmx = ninf;
  float mx;
  if (scale > 0.0f && scale < kInf) {
    for (int64_t j = 0; j < w; j += 16)
      vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(ninf, lanes(j), s + j));
    mx = _mm512_reduce_max_ps(vmx) * scale;
  } else {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < w; j += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + j), vscale);
      vmx = _mm512_max_ps(vmx, _mm512_mask_mov_ps(ninf, lanes(j), x));
    }
    mx = _mm512_reduce_max_ps(vmx);
  }
  const float m_new = fmax_(m, mx);
  const float m_off = m_new == -kInf ? 0.0f : m_new;
  const float alpha = fast_exp(m - m_off);  // exp(-inf) == 0 on the first block
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 c1 = _mm512_set1_ps(scale * kLog2e), c0 = _mm512_set1_ps(-m_off * kLog2e);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < w; j += 32) {
    const __m512 t0 = _mm512_fmadd_ps(_mm512_loadu_ps(s + j), c1, c0);
    const __m512 t1 = _mm512_fmadd_ps(_mm512_loadu_ps(s + j + 16), c1, c0);
    const __m512 p0 = exp2_softmax(_mm512_mask_mov_ps(ninf, lanes(j), t0));
    const __m512 p1 = exp2_softmax(_mm512_mask_mov_ps(ninf, lanes(j + 16), t1));
    const __m512i r = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    _mm512_storeu_si512(pb + j, r);
    // back to fp32: a bf16 is the high half of its float
    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(r, 16)));
    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(-65536))));
  }
  l = l * alpha + _mm512_reduce_add_ps(acc);
  m = m_new;
  return alpha;
}

// Transposes 16 keys x 16 words (pairs of head dims) into 16 rows of 16 keys:
// dst[p * BLOCK_N + i] = word p of key row i, for p < np (rows[i] == null: zeros;
// words at or past nwords: zeros). 32-bit 16 x 16 transpose in four shuffle stages.
BF_BF16_TARGET BF_INLINE void transpose_keys16(const uint16_t* const* rows, int64_t w0,
                                               int64_t nwords, int64_t np, uint32_t* dst) {
  const __mmask16 m = w0 + 16 <= nwords ? __mmask16(0xffff)
                      : w0 < nwords     ? __mmask16((1u << (nwords - w0)) - 1)
                                        : __mmask16(0);
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = rows[i] ? _mm512_maskz_loadu_epi32(m, rows[i] + 2 * w0) : _mm512_setzero_si512();
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0 b0 a1 b1 | a2 b2 a3 b3
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + k], lane L: column 4L + k of rows 4i..4i+3
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // 4 x 4 transpose of 128-bit lanes
    const __m512i x0 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xEE);
    t[k] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    t[4 + k] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    t[8 + k] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    t[12 + k] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
  for (int p = 0; p < 16 && p < np; ++p) _mm512_storeu_si512(dst + p * BLOCK_N, t[p]);
}

BF_INLINE uint32_t load_u32(const uint16_t* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

constexpr int BF16_ROWS = 8;  // query rows per micro-tile: 8 x 2 zmm accumulators

BF_BF16_TARGET BF_INLINE __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// s[r][j] = sum_p q2[r][p] . kt2[p][j] for r < ROWS, j < nkeys rounded up to 32 (the
// scale is applied by softmax_row_bf16).
template <int ROWS>
BF_BF16_TARGET BF_INLINE void score_tile_bf16(const uint32_t* BF_RESTRICT q2,
                                              const uint32_t* BF_RESTRICT kt2, int64_t dp,
                                              int64_t nkeys, float* BF_RESTRICT s) {
  for (int64_t jc = 0; jc < nkeys; jc += 32) {
    __m512 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const uint32_t* BF_RESTRICT k = kt2 + jc;
    for (int64_t p = 0; p < dp; ++p, k += BLOCK_N) {
      const __m512i k0 = _mm512_loadu_si512(k);
      const __m512i k1 = _mm512_loadu_si512(k + 16);
      for (int r = 0; r < ROWS; ++r) {
        const __m512i qv = _mm512_set1_epi32(static_cast<int>(q2[r * dp + p]));
        acc[r][0] = dot_bf16(acc[r][0], qv, k0);
        acc[r][1] = dot_bf16(acc[r][1], qv, k1);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      _mm512_storeu_ps(s + r * BLOCK_N + jc, acc[r][0]);
      _mm512_storeu_ps(s + r * BLOCK_N + jc + 16, acc[r][1]);
    }
  }
}

// o[r][dd] = o[r][dd] * alpha[r] + sum_i p[r][2i..2i+1] . v2[i][dd] for key pairs i < npairs.
template <int ROWS>
BF_BF16_TARGET BF_INLINE void pv_tile_bf16(const uint16_t* BF_RESTRICT p16,
                                           const uint32_t* BF_RESTRICT v2, int64_t dpad,
                                           int64_t npairs, const float* BF_RESTRICT alpha,
                                           float* BF_RESTRICT o) {
  for (int64_t dc = 0; dc < dpad; dc += 32) {
    __m512 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      acc[r][0] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dpad + dc), a);
      acc[r][1] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dpad + dc + 16), a);
    }
    const uint32_t* BF_RESTRICT vr = v2 + dc;
    for (int64_t i = 0; i < npairs; ++i, vr += dpad) {
      const __m512i v0 = _mm512_loadu_si512(vr);
      const __m512i v1 = _mm512_loadu_si512(vr + 16);
      for (int r = 0; r < ROWS; ++r) {
        const __m512i pv = _mm512_set1_epi32(static_cast<int>(load_u32(p16 + r * BLOCK_N + 2 * i)));
        acc[r][0] = dot_bf16(acc[r][0], pv, v0);
        acc[r][1] = dot_bf16(acc[r][1], pv, v1);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      _mm512_storeu_ps(o + r * dpad + dc, acc[r][0]);
      _mm512_storeu_ps(o + r * dpad + dc + 16, acc[r][1]);
    }
  }
}

// ---- AMX (amx_bf16): the same layouts feed tile loads. A tile holds 16 rows of 64
// bytes; tdpbf16ps C[16][16] += A[16][32 bf16] . B[16 pairs][16 x 2 bf16]:
//   scores: A = 16 query rows x 32 head dims of q2, B = 16 pairs of head dims x 16 keys
//           of kt2 (the head dims padded to 32 with zeros), C = 16 x 16 raw scores;
//   P V:    A = 16 rows x 32 keys of P, B = 16 key pairs x 16 head dims of v2,
//           C = 16 x 16 of this chunk's P V, added to o * alpha after (a tile cannot
//           be rescaled in place).
// The AMX path takes keys in chunks of up to AMX_CHUNK (one chunk for any sequence
// of BERT's lengths): all of a chunk's scores for 16 query rows, one softmax pass per
// row, then P V with the accumulators held in tiles across the whole chunk.
// Tiles: 0, 1 accumulators, 2 A, 3 and 4 B. Linux hands out the tile state only on
// request (arch_prctl ARCH_REQ_XCOMP_PERM), once per process.
#define BF_AMX_TARGET \
  __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16,prefer-vector-width=512")))

constexpr int64_t AMX_CHUNK = 4 * BLOCK_N;  // keys per softmax pass of the AMX path

// s[16][j] (row stride ld floats) = q2 . kt2 for the w keys k0 .. k0 + w - 1 (w a
// multiple of 32, k0 of BLOCK_N); dq = head dims padded to 32 (q2 rows are dq / 2
// words, kt2 holds dq / 2 rows of BLOCK_N words per key block).
BF_AMX_TARGET __attribute__((noinline)) void amx_scores(const uint32_t* q2, const uint32_t* kt2,
                                                        int64_t dq, int64_t k0, int64_t w, float* s,
                                                        int64_t ld) {
  const int64_t dp = dq / 2;
  if (dq == 32) _tile_loadd(2, q2, dq * 2);  // the whole of Q: loaded once
  for (int64_t jc = 0; jc < w; jc += 32) {
    const int64_t key = k0 + jc;
    const uint32_t* kb = kt2 + (key / BLOCK_N) * dp * BLOCK_N + key % BLOCK_N;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = 0; c < dq; c += 32) {
      if (dq != 32) _tile_loadd(2, q2 + c / 2, dq * 2);
      _tile_loadd(3, kb + (c / 2) * BLOCK_N, BLOCK_N * 4);
      _tile_loadd(4, kb + (c / 2) * BLOCK_N + 16, BLOCK_N * 4);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, s + jc, ld * 4);
    _tile_stored(1, s + jc + 16, ld * 4);
  }
}

// pv[16][dpad] = p16 . v2 over w keys (w a multiple of 32; P is 0 and v2 zero past the
// real keys); p16 rows are ld bf16 apart, v2 starts at the chunk's first key pair.
BF_AMX_TARGET __attribute__((noinline)) void amx_pv(const uint16_t* p16, int64_t ld,
                                                    const uint32_t* v2, int64_t dpad, int64_t w,
                                                    float* pv) {
  for (int64_t dc = 0; dc < dpad; dc += 32) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t kc = 0; kc < w; kc += 32) {
      _tile_loadd(2, p16 + kc, ld * 2);
      _tile_loadd(3, v2 + (kc / 2) * dpad + dc, dpad * 4);
      _tile_loadd(4, v2 + (kc / 2) * dpad + dc + 16, dpad * 4);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, pv + dc, dpad * 4);
    _tile_stored(1, pv + dc + 16, dpad * 4);
  }
}

// A task's real keys into kt2 / v2 (layouts above), nk32 = their count rounded up to
// 32 (what the micro-kernels read; the keys between are zeros): K word (p, j) of block
// kb = the pair (k[j][2p], k[j][2p + 1]), the key rows' words transposed 16 keys x 16
// words at a time (an odd head_dim word by word); V word (i, dd) = the pair
// (v[2i][dd], v[2i + 1][dd]), two key rows interleaved 32 head dims per step (a
// missing second key, or head dims past d, read as zero).
BF_BF16_TARGET BF_INLINE void pack_keys_values(const uint16_t* base,
                                               const std::vector<int64_t>& keys, int64_t nk32,
                                               int64_t ld, int64_t hidden, int64_t h, int64_t d,
                                               int64_t dp, int64_t dpad, uint32_t* BF_RESTRICT kt2,
                                               uint32_t* BF_RESTRICT v2) {
  const int64_t nk = static_cast<int64_t>(keys.size());
  if (d % 2 == 0) {
    const uint16_t* rows[16];
    for (int64_t j0 = 0; j0 < nk32; j0 += 16) {
      for (int i = 0; i < 16; ++i)
        rows[i] = j0 + i < nk ? base + keys[j0 + i] * ld + hidden + h * d : nullptr;
      uint32_t* blk = kt2 + (j0 / BLOCK_N) * dp * BLOCK_N + (j0 % BLOCK_N);
      for (int64_t w0 = 0; w0 < dp; w0 += 16)
        transpose_keys16(rows, w0, d / 2, dp - w0, blk + w0 * BLOCK_N);
    }
  } else {
    for (int64_t jj = 0; jj < nk32; ++jj) {
      uint32_t* BF_RESTRICT kcol = kt2 + (jj / BLOCK_N) * dp * BLOCK_N + (jj % BLOCK_N);
      if (jj < nk) {
        const uint16_t* krow = base + keys[jj] * ld + hidden + h * d;
        for (int64_t p = 0; p < d / 2; ++p) kcol[p * BLOCK_N] = load_u32(krow + 2 * p);
        kcol[(d / 2) * BLOCK_N] = krow[d - 1];
        for (int64_t p = (d + 1) / 2; p < dp; ++p) kcol[p * BLOCK_N] = 0;
      } else {
        for (int64_t p = 0; p < dp; ++p) kcol[p * BLOCK_N] = 0;
      }
    }
  }
  const __m512i lo_idx =
      _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  for (int64_t i = 0; i < nk32 / 2; ++i) {
    uint32_t* BF_RESTRICT vr = v2 + i * dpad;
    const uint16_t* va = 2 * i < nk ? base + keys[2 * i] * ld + 2 * hidden + h * d : nullptr;
    const uint16_t* vb =
        2 * i + 1 < nk ? base + keys[2 * i + 1] * ld + 2 * hidden + h * d : nullptr;
    for (int64_t dc = 0; dc < dpad; dc += 32) {
      const __mmask32 m = dc + 32 <= d ? ~__mmask32(0)
                          : dc < d     ? (__mmask32(1) << (d - dc)) - 1
                                       : 0;
      const __m512i a = va ? _mm512_maskz_loadu_epi16(m, va + dc) : _mm512_setzero_si512();
      const __m512i b = vb ? _mm512_maskz_loadu_epi16(m, vb + dc) : _mm512_setzero_si512();
      _mm512_storeu_si512(vr + dc, _mm512_permutex2var_epi16(a, lo_idx, b));
      _mm512_storeu_si512(vr + dc + 16, _mm512_permutex2var_epi16(a, hi_idx, b));
    }
  }
}

// Query rows q2 [ROWS][dp] words of rows g .. g + nr - 1 of the task (zeros past nr).
template <int ROWS>
BF_INLINE void load_queries(const uint16_t* base, const std::vector<int64_t>& qrows, int64_t g,
                            int nr, int64_t ld, int64_t h, int64_t d, int64_t dp, uint32_t* q2) {
  std::fill(q2, q2 + ROWS * dp, 0u);
  for (int r = 0; r < nr; ++r) {
    const uint16_t* qrow = base + qrows[g + r] * ld + h * d;
    for (int64_t p = 0; p < d / 2; ++p) q2[r * dp + p] = load_u32(qrow + 2 * p);
    if (d & 1) q2[r * dp + d / 2] = qrow[d - 1];
  }
}

// The output rows g .. g + nr - 1: o / l rounded to bf16 (l == 0: all scores -inf),
// 16 head dims at a time as from_f32<bf16> rounds one (nearest even, NaN stays a
// quiet NaN, subnormals kept).
BF_BF16_TARGET BF_INLINE void store_rows(bf16* obase, const std::vector<int64_t>& qrows, int64_t g,
                                         int nr, int64_t hidden, int64_t d, const float* op,
                                         int64_t dpad, const float* l) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (int r = 0; r < nr; ++r) {
    const __m512 inv = _mm512_set1_ps(l[r] == 0.0f ? 1.0f : 1.0f / l[r]);
    uint16_t* o = reinterpret_cast<uint16_t*>(obase + qrows[g + r] * hidden);
    const float* BF_RESTRICT orow = op + r * dpad;
    for (int64_t dd = 0; dd < d; dd += 16) {
      const __mmask16 m = dd + 16 <= d ? __mmask16(0xffff) : __mmask16((1u << (d - dd)) - 1);
      const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(orow + dd), inv));
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      const __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), odd), 16);
      const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
      const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
      const __m512i bits = _mm512_mask_blend_epi32(is_nan, rounded, nan);
      _mm256_mask_storeu_epi16(o + dd, m, _mm512_cvtepi32_epi16(bits));
    }
  }
}

// One task of the bf16 path (bf16 storage, AVX512-BF16, with AMX tiles when kAmx):
// query rows [q0, q0 + BLOCK_M) of head h of sequence sq, as the fp32-math path.
template <int ROWS, bool kAmx>
BF_BF16_TARGET BF_INLINE void bf16_task(bf16* out, const bf16* qkv, const Sequence& sq, int64_t h,
                                        int64_t q0, int64_t num_heads, int64_t hidden, float scale,
                                        Scratch& sc) {
  const int64_t d = hidden / num_heads;
  const int64_t dpad = (d + 31) / 32 * 32;
  const int64_t dp = kAmx ? dpad / 2 : (d + 1) / 2;  // words per Q row / K column
  const int64_t ld = 3 * hidden;
  const uint16_t* base = reinterpret_cast<const uint16_t*>(qkv) + sq.token0 * ld;
  bf16* obase = out + sq.token0 * hidden + h * d;

  if (!select_rows(sq, q0, obase, hidden, d, sc)) return;
  const std::vector<int64_t>& keys = sc.keys;
  const std::vector<int64_t>& qrows = sc.qrows;
  const int64_t nk = static_cast<int64_t>(keys.size());
  const int64_t nk32 = (nk + 31) / 32 * 32;
  const int64_t nkp = (nk + BLOCK_N - 1) / BLOCK_N * BLOCK_N;  // key blocks of kt2
  // AMX: scores and P of a whole chunk per row; else of one key block
  const int64_t sw = kAmx ? std::min(nk32, AMX_CHUNK) : BLOCK_N;

  if (static_cast<int64_t>(sc.kt2.size()) < dp * nkp) sc.kt2.resize(dp * nkp);
  if (static_cast<int64_t>(sc.v2.size()) < nk32 / 2 * dpad) sc.v2.resize(nk32 / 2 * dpad);
  if (static_cast<int64_t>(sc.q2.size()) < ROWS * dp) sc.q2.resize(ROWS * dp);
  if (static_cast<int64_t>(sc.p16.size()) < ROWS * sw) sc.p16.resize(ROWS * sw);
  if (static_cast<int64_t>(sc.obuf.size()) < ROWS * dpad) sc.obuf.resize(ROWS * dpad);
  if (static_cast<int64_t>(sc.sbuf.size()) < ROWS * sw) sc.sbuf.resize(ROWS * sw);
  if (kAmx && static_cast<int64_t>(sc.pvbuf.size()) < ROWS * dpad) sc.pvbuf.resize(ROWS * dpad);
  uint32_t* BF_RESTRICT kt2 = sc.kt2.data();
  uint32_t* BF_RESTRICT v2 = sc.v2.data();
  pack_keys_values(base, keys, nk32, ld, hidden, h, d, dp, dpad, kt2, v2);

  float m[ROWS], l[ROWS], alphas[ROWS];
  const int64_t nq = static_cast<int64_t>(qrows.size());
  for (int64_t g = 0; g < nq; g += ROWS) {
    const int nr = static_cast<int>(std::min<int64_t>(ROWS, nq - g));
    uint32_t* BF_RESTRICT q2 = sc.q2.data();
    uint16_t* BF_RESTRICT p16 = sc.p16.data();
    float* BF_RESTRICT op = sc.obuf.data();
    float* BF_RESTRICT sp = sc.sbuf.data();
    load_queries<ROWS>(base, qrows, g, nr, ld, h, d, dp, q2);
    std::fill(op, op + ROWS * dpad, 0.0f);
    for (int r = 0; r < ROWS; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
    }
    const int64_t step = kAmx ? AMX_CHUNK : BLOCK_N;
    for (int64_t kb = 0; kb < nk; kb += step) {
      const int64_t valid = std::min<int64_t>(step, nk - kb);
      const int64_t w = (valid + 31) / 32 * 32;  // columns the micro-kernels fill and read
      if constexpr (kAmx) {
        amx_scores(q2, kt2, dpad, kb, w, sp, sw);
      } else {
        score_tile_bf16<ROWS>(q2, kt2 + kb * dp, dp, valid, sp);
      }
      for (int r = 0; r < ROWS; ++r)
        alphas[r] = softmax_row_bf16(sp + r * sw, valid, scale, m[r], l[r], p16 + r * sw);
      if constexpr (kAmx) {
        float* BF_RESTRICT pv = sc.pvbuf.data();
        amx_pv(p16, sw, v2 + kb / 2 * dpad, dpad, w, pv);
        for (int r = 0; r < ROWS; ++r) {
          const __m512 a = _mm512_set1_ps(alphas[r]);
          for (int64_t dd = 0; dd < dpad; dd += 16)
            _mm512_storeu_ps(op + r * dpad + dd,
                             _mm512_fmadd_ps(_mm512_loadu_ps(op + r * dpad + dd), a,
                                             _mm512_loadu_ps(pv + r * dpad + dd)));
        }
      } else {
        pv_tile_bf16<ROWS>(p16, v2 + kb / 2 * dpad, dpad, (valid + 1) / 2, alphas, op);
      }
    }
    store_rows(obase, qrows, g, nr, hidden, d, op, dpad, l);
  }
}

BF_BF16_TARGET __attribute__((noinline)) void task_avx512_bf16(bf16* out, const bf16* qkv,
                                                               const Sequence& sq, int64_t h,
                                                               int64_t q0, int64_t num_heads,
                                                               int64_t hidden, float scale,
                                                               Scratch& sc) {
  bf16_task<BF16_ROWS, false>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

BF_BF16_TARGET __attribute__((noinline)) void task_amx_bf16(bf16* out, const bf16* qkv,
                                                            const Sequence& sq, int64_t h,
                                                            int64_t q0, int64_t num_heads,
                                                            int64_t hidden, float scale,
                                                            Scratch& sc) {
  bf16_task<16, true>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

}  // namespace

void run_bf16_task(bool amx, bf16* out, const bf16* qkv, const Sequence& sq, int64_t h, int64_t q0,
                   int64_t num_heads, int64_t hidden, float scale, Scratch& sc) {
  if (amx) {
    task_amx_bf16(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  } else {
    task_avx512_bf16(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  }
}

// Declared (with their contracts) in attention_internal.h.
BF_AMX_TARGET __attribute__((noinline)) void amx_tiles_begin() { amx_configure_16x64(5); }

BF_AMX_TARGET __attribute__((noinline)) void amx_tiles_end() { _tile_release(); }

bool amx_available() {
#if defined(BF_AMX_LINUX)
  static const bool ok = [] {
    unsigned a, b, c, dx;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, dx);
    const bool tile = (dx >> 24) & 1, amx_bf16 = (dx >> 22) & 1;
    if (!tile || !amx_bf16 || !__builtin_cpu_supports("avx512bf16")) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace attn

bool amx_bf16_available() { return attn::amx_available(); }

}  // namespace cpu
}  // namespace bertfast
#endif  // BF_X86
