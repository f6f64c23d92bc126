// Multi-head self-attention reading the fused QKV tensor, heads merged on output.
//
//   qkv [tokens, 3H]  = [Q | K | V], head h at columns h*d, H + h*d, 2H + h*d
//   out [tokens, H]   = softmax(scale * Q K^T over the sequence's real keys) V
//
// Two entry points share one kernel: attention_padded ([B, S] with a key-padding
// mask; padded query rows are written as zeros, a sequence with no real key gives
// zeros) and attention_varlen (packed sequences delimited by cu_seqlens).
//
// Work split: one task = (sequence, head, block of BLOCK_M query rows); OpenMP
// dynamic schedule over tasks. A task first copies its head's real keys into fp32
// scratch (row-major K [keys][d] and V [keys][dpad]; O(S * d) memory, whatever the
// storage dtype), prefetching the strided token rows ahead. Masked keys are simply
// left out, so no score is ever masked. Then a group of query rows at a time, one
// query per vector lane, goes through the keys, BLOCK_N at a time, with an online
// softmax (fp32 running max and sum per lane):
//   scores  s[keys][lanes] = K . q^T
//   p = exp(s - m_new), l = l * alpha + sum p, o = o * alpha + p V
// (register-blocked micro-kernels, AVX-512 or AVX2 chosen at run time; see the
// fp32-math path below).
//
// bf16 storage on a CPU with AVX512-BF16 takes a path of its own (bf16_task):
// Q K^T and P V on AMX tiles (tdpbf16ps, where the CPU has amx_bf16 and Linux grants
// the tile state) or else vdpbf16ps: bf16 products, exact in fp32, summed in fp32;
// the operands kept in bf16 in scratch, laid out in pairs along the reduction
// dimension as both instructions read them. The scale is applied to the fp32
// scores, the softmax statistics (max, sum) are fp32, and P is rounded to bf16
// (round to nearest even, relative error <= 2^-9) before P V; the row sum l is
// taken over the rounded P, so the weights applied to V sum to 1 in fp32.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/common.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define BF_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define BF_AMX_LINUX 1
#endif
#endif

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t BLOCK_M = 256;  // query rows per task (K / V are packed once per task)
constexpr int64_t BLOCK_N = 128;  // keys per online-softmax step

// The fp32 micro-kernels use GCC/Clang vector extensions (v8f / v16f of common.h, no
// intrinsics): with a tile of accumulators held in registers the compiler's own loop
// vectoriser would not keep them out of memory. Variants (AVX-512 / AVX2) chosen at
// run time.

// Unaligned vector load / store (memcpy: an aligned(4) typedef does not stop GCC
// from emitting aligned moves for 64-byte vectors).
template <typename V>
BF_INLINE V load_v(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
BF_INLINE void store_v(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// *p in every lane. On x86 a vbroadcastss from memory (a load-port op, leaving the
// FMA ports to the FMAs): GCC 12 compiles the portable `V{} + *p` to a scalar add
// (0 + x is not x for x = -0) and a register broadcast, and per-lane forms to a
// chain of masked broadcasts.
template <typename V>
BF_INLINE V splat_at(const float* p) {
#ifdef BF_X86
  V v;
  asm("vbroadcastss %1, %0" : "=v"(v) : "m"(*p));
  return v;
#else
  return V{} + *p;
#endif
}

struct Sequence {
  int64_t token0;       // first token (row of qkv / out)
  int64_t len;          // tokens (queries == keys)
  const uint8_t* mask;  // [len] nonzero = real token, or null (all real)
};

struct Task {
  int64_t seq, head, q0;
};

// Per-thread scratch, reused across tasks.
struct Scratch {
  std::vector<int64_t> keys, qrows;
  std::vector<float> kt, vbuf, qbuf, obuf, sbuf;
  // bf16 path: 32-bit words, each a pair of bf16 along the reduction dimension
  std::vector<uint32_t> kt2, v2, q2;
  std::vector<uint16_t> p16;  // P rows in bf16, read as pairs
  std::vector<float> pvbuf;   // AMX: one key block's P V
};

// The keys and query rows a task works on: the sequence's real keys, and its real
// query rows in [q0, q0 + BLOCK_M) (the others are written as zeros here: padded
// query rows, or every row when no key is real). Returns false when no row is left.
template <typename T>
bool select_rows(const Sequence& sq, int64_t q0, T* obase, int64_t hidden, int64_t d, Scratch& sc) {
  const int64_t q1 = std::min(q0 + BLOCK_M, sq.len);
  const T zero = from_f32<T>(0.0f);
  sc.keys.clear();
  for (int64_t j = 0; j < sq.len; ++j)
    if (!sq.mask || sq.mask[j]) sc.keys.push_back(j);
  const bool any_key = !sc.keys.empty();
  sc.qrows.clear();
  for (int64_t i = q0; i < q1; ++i) {
    if (any_key && (!sq.mask || sq.mask[i])) {
      sc.qrows.push_back(i);
    } else {
      T* o = obase + i * hidden;
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = zero;
    }
  }
  return !sc.qrows.empty();
}

// One row of an online-softmax step, shared by all paths. sr holds BLOCK_N fp32
// scores (those past the block's real keys already -inf); they are replaced by
// p = exp(s - m_new). Updates the running max m (and with kSum the running sum l:
// the bf16 paths sum P after rounding it) and returns alpha = exp(m_old - m_new).
//
// Non-finite scores propagate as in torch's softmax, with nothing added to the
// loops: fast_exp(NaN) is NaN, so a NaN score (NaN in q, k or scale) makes its p,
// the row sum and the row NaN whatever the max reduction did with it; a +inf
// score gives p = exp(inf - inf) = NaN. While every score so far is -inf, the
// offset is 0 instead of -inf (exp(-inf - -inf) would be NaN): those keys get
// p = 0, and a row whose real scores are all -inf ends with l = 0 and is written
// as p V = 0 (torch's SDPA: zeros; NaN still where V holds inf or NaN, as 0 * inf
// in torch).
template <bool kSum>
BF_INLINE float softmax_step(float* BF_RESTRICT sr, float& m, float& l) {
  float mx = -std::numeric_limits<float>::infinity();
  BF_SIMD_REDUCE_MAX(mx)
  for (int64_t j = 0; j < BLOCK_N; ++j) mx = fmax_(mx, sr[j]);
  const float m_new = fmax_(m, mx);
  const float m_off = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
  const float alpha = fast_exp(m - m_off);  // exp(-inf) == 0 on the first block
  if constexpr (kSum) {
    float sum = 0.0f;
    BF_SIMD_REDUCE_ADD(sum)
    for (int64_t j = 0; j < BLOCK_N; ++j) {
      const float p = fast_exp(sr[j] - m_off);
      sr[j] = p;
      sum += p;
    }
    l = l * alpha + sum;
  } else {
    for (int64_t j = 0; j < BLOCK_N; ++j) sr[j] = fast_exp(sr[j] - m_off);
  }
  m = m_new;
  return alpha;
}

// ------------------------------------------------------------------ fp32-math path
// Queries in vector lanes: a group of L = QV * VL query rows is processed at once,
// one lane per query, so every key / value element loaded is used by L queries and
// the softmax needs no horizontal reductions (its max and sum run down the keys,
// lane by lane). Per task the head's real keys are copied once, row-major, into fp32
// scratch (k [nkr][d], v [nkr][dpad], nkr = keys rounded up to KJ with zero rows,
// dpad = d rounded up to VL with zero columns); per group the query rows are
// transposed and scaled into qt [d][L]. Then, BLOCK_N keys at a time (online softmax):
//   scores  st[j][L] = sum_dd k[j][dd] * qt[dd][L]     (score_tile: KJ keys x QV vectors)
//   m_new = max(m, max_j st), p = exp(st - m_new), l = l * alpha + sum_j p
//                                                      (softmax_lanes: QV vectors a key)
//   ot[L][dd] = ot * alpha + sum_j p[j][L] * v[j][dd]  (pv_tile: R queries x 2 vectors of dims)
// The micro-tiles hold their accumulators in registers; per step the score tile
// loads QV vectors plus KJ broadcast scalars, the P V tile 2 vectors plus R broadcasts:
//   AVX-512 (x86-64-v4): VL = 16, QV = 2, KJ = 8, R = 8 -> 32 queries a group, 16 zmm accumulators
//   AVX2/FMA (baseline):  VL = 8,  QV = 2, KJ = 4, R = 4 -> 16 queries a group, 8 ymm accumulators
// Finally out[row][dd] = ot[row][dd] / l[row], each row written as it is (query-major).

// st[j][0..L) = sum_dd k[j][dd] * qt[dd][0..L) for j < nkeys rounded up to KJ.
template <typename V, int VL, int QV, int KJ>
BF_INLINE void score_tile(const float* BF_RESTRICT qt, const float* BF_RESTRICT k, int64_t d,
                          int64_t nkeys, float* BF_RESTRICT st) {
  constexpr int L = QV * VL;
  for (int64_t j0 = 0; j0 < nkeys; j0 += KJ) {
    V acc[KJ][QV];
    for (int jj = 0; jj < KJ; ++jj)
      for (int c = 0; c < QV; ++c) acc[jj][c] = V{};
    const float* BF_RESTRICT kr = k + j0 * d;
    for (int64_t dd = 0; dd < d; ++dd) {
      V q[QV];
      for (int c = 0; c < QV; ++c) q[c] = load_v<V>(qt + dd * L + c * VL);
      for (int jj = 0; jj < KJ; ++jj) {
        const V kv = splat_at<V>(kr + jj * d + dd);
        for (int c = 0; c < QV; ++c) acc[jj][c] += kv * q[c];
      }
    }
    for (int jj = 0; jj < KJ; ++jj)
      for (int c = 0; c < QV; ++c) store_v<V>(st + (j0 + jj) * L + c * VL, acc[jj][c]);
  }
}

// ot[r][d0..d0 + DV VL) = ot[r] * alpha[r] + sum_{j < nkeys} p[j][r] * v[j][d0..) for
// the R query rows r0 <= r < r0 + R: R x DV vector accumulators in registers; per key
// DV loads of V and R broadcasts of P.
template <typename V, int VL, int L, int R, int DV>
BF_INLINE void pv_block(const float* BF_RESTRICT p, const float* BF_RESTRICT v, int64_t dpad,
                        int64_t nkeys, const float* BF_RESTRICT alpha, float* BF_RESTRICT ot,
                        int r0, int64_t d0) {
  V acc[R][DV];
  for (int r = 0; r < R; ++r) {
    const V a = splat_at<V>(alpha + r0 + r);
    for (int c = 0; c < DV; ++c) acc[r][c] = load_v<V>(ot + (r0 + r) * dpad + d0 + c * VL) * a;
  }
  const float* BF_RESTRICT vr = v + d0;
  const float* BF_RESTRICT pr = p + r0;
  for (int64_t j = 0; j < nkeys; ++j, vr += dpad, pr += L) {
    V vv[DV];
    for (int c = 0; c < DV; ++c) vv[c] = load_v<V>(vr + c * VL);
    for (int r = 0; r < R; ++r) {
      const V pj = splat_at<V>(pr + r);
      for (int c = 0; c < DV; ++c) acc[r][c] += pj * vv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DV; ++c) store_v<V>(ot + (r0 + r) * dpad + d0 + c * VL, acc[r][c]);
}

// ot[r][0..dpad) = ot[r] * alpha[r] + sum_{j < nkeys} p[j][r] * v[j][0..dpad) for the L
// query rows of a group: P [nkeys][L] as the scores are (queries in lanes), the output
// query-major (each row written out as it is); dpad a multiple of VL.
template <typename V, int VL, int QV, int R>
BF_INLINE void pv_tile(const float* BF_RESTRICT p, const float* BF_RESTRICT v, int64_t dpad,
                       int64_t nkeys, const float* BF_RESTRICT alpha, float* BF_RESTRICT ot) {
  constexpr int L = QV * VL;
  static_assert(L % R == 0, "query rows per block must divide the group");
  for (int r0 = 0; r0 < L; r0 += R) {
    int64_t d0 = 0;
    for (; d0 + 2 * VL <= dpad; d0 += 2 * VL)
      pv_block<V, VL, L, R, 2>(p, v, dpad, nkeys, alpha, ot, r0, d0);
    if (d0 < dpad) pv_block<V, VL, L, R, 1>(p, v, dpad, nkeys, alpha, ot, r0, d0);
  }
}

// One online-softmax step down nkeys keys of st [nkeys][L], lane by lane: the scores
// are replaced by p = exp(s - m_new), m and l updated, alpha = exp(m_old - m_new).
// Same non-finite rules as softmax_step (NaN propagates through p; while all scores
// so far are -inf the offset is 0, so p = 0 and a row with no finite score ends with
// l = 0 and is written as zeros).
template <typename V, int VL, int QV>
BF_INLINE void softmax_lanes(float* BF_RESTRICT st, int64_t nkeys, float* BF_RESTRICT m,
                             float* BF_RESTRICT l, float* BF_RESTRICT alpha) {
  constexpr int L = QV * VL;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // The max in two interleaved chains per vector (the order does not matter, NaN
  // included: a NaN score makes its own p NaN whatever the max is). Every running
  // value is a vector variable, so it stays in a register.
  V mx[QV], mx1[QV], off[QV], a[QV], sum[QV];
  for (int c = 0; c < QV; ++c) mx[c] = mx1[c] = load_v<V>(m + c * VL);
  int64_t j = 0;
  for (; j + 2 <= nkeys; j += 2)
    for (int c = 0; c < QV; ++c) {
      const V s0 = load_v<V>(st + j * L + c * VL), s1 = load_v<V>(st + (j + 1) * L + c * VL);
      mx[c] = mx[c] > s0 ? mx[c] : s0;
      mx1[c] = mx1[c] > s1 ? mx1[c] : s1;
    }
  for (; j < nkeys; ++j)
    for (int c = 0; c < QV; ++c) {
      const V s0 = load_v<V>(st + j * L + c * VL);
      mx[c] = mx[c] > s0 ? mx[c] : s0;
    }
  for (int c = 0; c < QV; ++c) {
    mx[c] = mx[c] > mx1[c] ? mx[c] : mx1[c];
    off[c] = mx[c] == kNegInf ? V{} : mx[c];
    a[c] = fast_exp(load_v<V>(m + c * VL) - off[c]);  // exp(-inf) == 0 on the first block
    store_v<V>(alpha + c * VL, a[c]);
    store_v<V>(m + c * VL, mx[c]);
    sum[c] = V{};
  }
  for (int64_t j = 0; j < nkeys; ++j)
    for (int c = 0; c < QV; ++c) {
      const V p = fast_exp(load_v<V>(st + j * L + c * VL) - off[c]);
      store_v<V>(st + j * L + c * VL, p);
      sum[c] += p;
    }
  for (int c = 0; c < QV; ++c) store_v<V>(l + c * VL, load_v<V>(l + c * VL) * a[c] + sum[c]);
}

// Prefetches `bytes` bytes at q, q + hidden and q + 2 hidden (one token's Q, K and V
// slices of a head) into cache.
template <typename T>
BF_INLINE void prefetch_qkv_row(const T* q, int64_t hidden, int64_t bytes) {
  for (int part = 0; part < 3; ++part) {
    const char* p = reinterpret_cast<const char*>(q + part * hidden);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
    __builtin_prefetch(p + bytes - 1);  // the last line, when q is not 64-byte aligned
  }
}

// One task: query rows [q0, q0 + BLOCK_M) of head h of sequence sq.
template <typename T, typename V, int VL, int QV, int KJ, int R>
BF_INLINE void attention_task(T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0,
                              int64_t num_heads, int64_t hidden, float scale, Scratch& sc) {
  constexpr int L = QV * VL;
  const int64_t d = hidden / num_heads;
  const int64_t dpad = (d + VL - 1) / VL * VL;
  const int64_t ld = 3 * hidden;
  const T* base = qkv + sq.token0 * ld;
  T* obase = out + sq.token0 * hidden + h * d;

  if (!select_rows(sq, q0, obase, hidden, d, sc)) return;
  const std::vector<int64_t>& keys = sc.keys;
  const std::vector<int64_t>& qrows = sc.qrows;
  const int64_t nk = static_cast<int64_t>(keys.size());

  // K and V of this head's real keys, fp32, row-major, zero-padded to nkr rows.
  const int64_t nkr = (nk + KJ - 1) / KJ * KJ;
  if (static_cast<int64_t>(sc.kt.size()) < nkr * d) sc.kt.resize(nkr * d);
  if (static_cast<int64_t>(sc.vbuf.size()) < nkr * dpad) sc.vbuf.resize(nkr * dpad);
  if (static_cast<int64_t>(sc.qbuf.size()) < d * L) sc.qbuf.resize(d * L);
  if (static_cast<int64_t>(sc.obuf.size()) < dpad * L) sc.obuf.resize(dpad * L);
  if (static_cast<int64_t>(sc.sbuf.size()) < BLOCK_N * L) sc.sbuf.resize(BLOCK_N * L);
  float* BF_RESTRICT kp = sc.kt.data();
  float* BF_RESTRICT vp = sc.vbuf.data();
  // The head's slices of Q, K and V are d elements out of each 3H-element token row:
  // a stride of several KiB, past what the hardware prefetchers follow, so each row
  // would be a cache miss waited for in turn. Prefetch PF rows ahead (the Q slices
  // too: the query loop below reads the same tokens).
  constexpr int64_t PF = 8;
  const int64_t slice = d * static_cast<int64_t>(sizeof(T));
  for (int64_t jj = 0; jj < std::min<int64_t>(PF, sq.len); ++jj)
    prefetch_qkv_row(base + jj * ld + h * d, hidden, slice);
  for (int64_t jj = 0; jj < nk; ++jj) {
    if (keys[jj] + PF < sq.len)
      prefetch_qkv_row(base + (keys[jj] + PF) * ld + h * d, hidden, slice);
    const T* krow = base + keys[jj] * ld + hidden + h * d;
    const T* vrow = base + keys[jj] * ld + 2 * hidden + h * d;
    float* BF_RESTRICT kr = kp + jj * d;
    float* BF_RESTRICT vr = vp + jj * dpad;
    for (int64_t dd = 0; dd < d; ++dd) kr[dd] = to_f32(krow[dd]);
    for (int64_t dd = 0; dd < d; ++dd) vr[dd] = to_f32(vrow[dd]);
    for (int64_t dd = d; dd < dpad; ++dd) vr[dd] = 0.0f;
  }
  std::fill(kp + nk * d, kp + nkr * d, 0.0f);
  std::fill(vp + nk * dpad, vp + nkr * dpad, 0.0f);

  alignas(64) float m[L], l[L], alpha[L];
  float* BF_RESTRICT qt = sc.qbuf.data();
  float* BF_RESTRICT ot = sc.obuf.data();
  float* BF_RESTRICT st = sc.sbuf.data();
  const int64_t nq = static_cast<int64_t>(qrows.size());
  for (int64_t g = 0; g < nq; g += L) {
    const int nr = static_cast<int>(std::min<int64_t>(L, nq - g));
    // qt[dd][lane] = scale * q[row lane][dd]; lanes past nr are zero (their output is dropped).
    std::fill(qt, qt + d * L, 0.0f);
    for (int r = 0; r < nr; ++r) {
      const T* qrow = base + qrows[g + r] * ld + h * d;
      for (int64_t dd = 0; dd < d; ++dd) qt[dd * L + r] = to_f32(qrow[dd]) * scale;
    }
    std::fill(ot, ot + dpad * L, 0.0f);
    for (int c = 0; c < L; ++c) {
      m[c] = -std::numeric_limits<float>::infinity();
      l[c] = 0.0f;
    }
    for (int64_t kb = 0; kb < nk; kb += BLOCK_N) {
      const int64_t valid = std::min<int64_t>(BLOCK_N, nk - kb);  // real keys in this block
      score_tile<V, VL, QV, KJ>(qt, kp + kb * d, d, valid, st);
      softmax_lanes<V, VL, QV>(st, valid, m, l, alpha);
      pv_tile<V, VL, QV, R>(st, vp + kb * dpad, dpad, valid, alpha, ot);
    }
    for (int r = 0; r < nr; ++r) {
      const float inv = l[r] == 0.0f ? 1.0f : 1.0f / l[r];  // l == 0: all scores -inf
      T* o = obase + qrows[g + r] * hidden;
      const float* BF_RESTRICT orow = ot + r * dpad;
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = from_f32<T>(orow[dd] * inv);
    }
  }
}
#ifdef BF_X86
// ------------------------------------------------------------------ bf16 path
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

// pb = p rounded to bf16 (nearest even; NaN stays NaN), BLOCK_N of them; returns the
// sum of the rounded values.
BF_BF16_TARGET BF_INLINE float round_bf16_sum(const float* BF_RESTRICT p,
                                              uint16_t* BF_RESTRICT pb) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < BLOCK_N; j += 32) {
    const __m512i r =
        (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + j + 16), _mm512_loadu_ps(p + j));
    _mm512_storeu_si512(pb + j, r);
    // back to fp32: a bf16 is the high half of its float
    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(r, 16)));
    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(-65536))));
  }
  return _mm512_reduce_add_ps(acc);
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

// s[r][j] = scale * sum_p q2[r][p] . kt2[p][j] for r < ROWS, j < nkeys rounded up to 32.
template <int ROWS>
BF_BF16_TARGET BF_INLINE void score_tile_bf16(const uint32_t* BF_RESTRICT q2,
                                              const uint32_t* BF_RESTRICT kt2, int64_t dp,
                                              int64_t nkeys, float scale, float* BF_RESTRICT s) {
  const __m512 vscale = _mm512_set1_ps(scale);
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
      _mm512_storeu_ps(s + r * BLOCK_N + jc, _mm512_mul_ps(acc[r][0], vscale));
      _mm512_storeu_ps(s + r * BLOCK_N + jc + 16, _mm512_mul_ps(acc[r][1], vscale));
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
//           of kt2 (the head dims padded to 32 with zeros), C = 16 x 16 scores;
//   P V:    A = 16 rows x 32 keys of P, B = 16 key pairs x 16 head dims of v2,
//           C = 16 x 16 of this block's P V, added to o * alpha after (a tile cannot be
//           rescaled in place).
// Tiles: 0, 1 accumulators, 2 A, 3 and 4 B. Linux hands out the tile state only on
// request (arch_prctl ARCH_REQ_XCOMP_PERM), once per process.
#define BF_AMX_TARGET \
  __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16,prefer-vector-width=512")))

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Whether this process may use AMX bf16 tiles: the CPU has them and (Linux only; no
// AMX elsewhere) the kernel grants the tile state to the process.
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

BF_AMX_TARGET __attribute__((noinline)) void amx_begin() {
  TileConfig cfg = {};
  cfg.palette = 1;
  for (int t = 0; t < 5; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // ldtilecfg by hand: GCC 12's _tile_loadconfig names only 8 bytes of the config as
  // read, so the stores of the rest are dropped as dead.
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

BF_AMX_TARGET __attribute__((noinline)) void amx_end() { _tile_release(); }

// s[16][j] = scale * q2 . kt2 for keys j < nkeys rounded up to 32; dq = head dims
// padded to 32 (q2 rows are dq / 2 words, kt2 has dq / 2 rows of BLOCK_N words).
BF_AMX_TARGET __attribute__((noinline)) void amx_scores(const uint32_t* q2, const uint32_t* kt2,
                                                        int64_t dq, int64_t nkeys, float scale,
                                                        float* s) {
  for (int64_t jc = 0; jc < nkeys; jc += 32) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = 0; c < dq; c += 32) {
      _tile_loadd(2, q2 + c / 2, dq * 2);
      _tile_loadd(3, kt2 + (c / 2) * BLOCK_N + jc, BLOCK_N * 4);
      _tile_loadd(4, kt2 + (c / 2) * BLOCK_N + jc + 16, BLOCK_N * 4);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, s + jc, BLOCK_N * 4);
    _tile_stored(1, s + jc + 16, BLOCK_N * 4);
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int r = 0; r < 16; ++r)
    for (int64_t j = 0; j < nkeys; j += 16)
      _mm512_storeu_ps(s + r * BLOCK_N + j,
                       _mm512_mul_ps(_mm512_loadu_ps(s + r * BLOCK_N + j), vscale));
}

// o[16][dd] = o * alpha + p16 . v2 over keys < nkeys rounded up to 32 (P is 0 and v2
// zero past the real keys); pv is [16][dpad] fp32 scratch.
BF_AMX_TARGET __attribute__((noinline)) void amx_pv(const uint16_t* p16, const uint32_t* v2,
                                                    int64_t dpad, int64_t nkeys, const float* alpha,
                                                    float* pv, float* o) {
  for (int64_t dc = 0; dc < dpad; dc += 32) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t kc = 0; kc < nkeys; kc += 32) {
      _tile_loadd(2, p16 + kc, BLOCK_N * 2);
      _tile_loadd(3, v2 + (kc / 2) * dpad + dc, dpad * 4);
      _tile_loadd(4, v2 + (kc / 2) * dpad + dc + 16, dpad * 4);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, pv + dc, dpad * 4);
    _tile_stored(1, pv + dc + 16, dpad * 4);
  }
  for (int r = 0; r < 16; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int64_t dd = 0; dd < dpad; dd += 16)
      _mm512_storeu_ps(o + r * dpad + dd, _mm512_fmadd_ps(_mm512_loadu_ps(o + r * dpad + dd), a,
                                                          _mm512_loadu_ps(pv + r * dpad + dd)));
  }
}

// One task of the bf16 path (bf16 storage, AVX512-BF16, with AMX tiles when kAmx):
// as attention_task.
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

  const int64_t nkp = (nk + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
  if (static_cast<int64_t>(sc.kt2.size()) < dp * nkp) sc.kt2.resize(dp * nkp);
  if (static_cast<int64_t>(sc.v2.size()) < nkp / 2 * dpad) sc.v2.resize(nkp / 2 * dpad);
  if (static_cast<int64_t>(sc.q2.size()) < ROWS * dp) sc.q2.resize(ROWS * dp);
  if (static_cast<int64_t>(sc.p16.size()) < ROWS * BLOCK_N) sc.p16.resize(ROWS * BLOCK_N);
  if (static_cast<int64_t>(sc.obuf.size()) < ROWS * dpad) sc.obuf.resize(ROWS * dpad);
  if (static_cast<int64_t>(sc.sbuf.size()) < ROWS * BLOCK_N) sc.sbuf.resize(ROWS * BLOCK_N);
  if (kAmx && static_cast<int64_t>(sc.pvbuf.size()) < ROWS * dpad) sc.pvbuf.resize(ROWS * dpad);
  uint32_t* BF_RESTRICT kt2 = sc.kt2.data();
  uint32_t* BF_RESTRICT v2 = sc.v2.data();

  // K: word (p, j) of block kb = the pair (k[j][2p], k[j][2p + 1]): the key rows'
  // words transposed, 16 keys x 16 words at a time (an odd head_dim word by word).
  if (d % 2 == 0) {
    const uint16_t* rows[16];
    for (int64_t j0 = 0; j0 < nkp; j0 += 16) {
      for (int i = 0; i < 16; ++i)
        rows[i] = j0 + i < nk ? base + keys[j0 + i] * ld + hidden + h * d : nullptr;
      uint32_t* blk = kt2 + (j0 / BLOCK_N) * dp * BLOCK_N + (j0 % BLOCK_N);
      for (int64_t w0 = 0; w0 < dp; w0 += 16)
        transpose_keys16(rows, w0, d / 2, dp - w0, blk + w0 * BLOCK_N);
    }
  } else {
    for (int64_t jj = 0; jj < nkp; ++jj) {
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
  // V: word (i, dd) = the pair (v[2i][dd], v[2i + 1][dd]): two key rows interleaved,
  // 32 head dims per step (a missing second key, or head dims past d, read as zero).
  const __m512i lo_idx =
      _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  for (int64_t i = 0; i < nkp / 2; ++i) {
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

  float m[ROWS], l[ROWS], alphas[ROWS];
  const int64_t nq = static_cast<int64_t>(qrows.size());
  for (int64_t g = 0; g < nq; g += ROWS) {
    const int nr = static_cast<int>(std::min<int64_t>(ROWS, nq - g));
    uint32_t* BF_RESTRICT q2 = sc.q2.data();
    uint16_t* BF_RESTRICT p16 = sc.p16.data();
    float* BF_RESTRICT op = sc.obuf.data();
    float* BF_RESTRICT sp = sc.sbuf.data();
    std::fill(q2, q2 + ROWS * dp, 0u);
    std::fill(op, op + ROWS * dpad, 0.0f);
    for (int r = 0; r < nr; ++r) {
      const uint16_t* qrow = base + qrows[g + r] * ld + h * d;
      for (int64_t p = 0; p < d / 2; ++p) q2[r * dp + p] = load_u32(qrow + 2 * p);
      if (d & 1) q2[r * dp + d / 2] = qrow[d - 1];
    }
    for (int r = 0; r < ROWS; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
    }
    for (int64_t kb = 0; kb < nkp; kb += BLOCK_N) {
      const int64_t valid = std::min<int64_t>(BLOCK_N, nk - kb);
      if constexpr (kAmx) {
        amx_scores(q2, kt2 + kb * dp, dpad, valid, scale, sp);
      } else {
        score_tile_bf16<ROWS>(q2, kt2 + kb * dp, dp, valid, scale, sp);
      }
      for (int r = 0; r < ROWS; ++r) {
        float* BF_RESTRICT sr = sp + r * BLOCK_N;
        for (int64_t j = valid; j < BLOCK_N; ++j) sr[j] = -std::numeric_limits<float>::infinity();
        alphas[r] = softmax_step<false>(sr, m[r], l[r]);
        l[r] = l[r] * alphas[r] + round_bf16_sum(sr, p16 + r * BLOCK_N);
      }
      if constexpr (kAmx) {
        amx_pv(p16, v2 + kb / 2 * dpad, dpad, valid, alphas, sc.pvbuf.data(), op);
      } else {
        pv_tile_bf16<ROWS>(p16, v2 + kb / 2 * dpad, dpad, (valid + 1) / 2, alphas, op);
      }
    }
    for (int r = 0; r < nr; ++r) {
      const float inv = l[r] == 0.0f ? 1.0f : 1.0f / l[r];  // l == 0: all scores -inf
      bf16* o = obase + qrows[g + r] * hidden;
      const float* BF_RESTRICT orow = op + r * dpad;
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = from_f32<bf16>(orow[dd] * inv);
    }
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
  amx_begin();
  bf16_task<16, true>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  amx_end();
}
#endif  // BF_X86

// Per-task entry points, one per instruction set. The OpenMP loop stays outside
// them (an outlined parallel region would not inherit the target attribute).
// prefer-vector-width=512: the softmax loops in 16 lanes too.
template <typename T>
__attribute__((target("arch=x86-64-v4,prefer-vector-width=512"))) __attribute__((noinline)) void
task_avx512(T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0, int64_t num_heads,
            int64_t hidden, float scale, Scratch& sc) {
  attention_task<T, v16f, 16, 2, 8, 8>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

template <typename T>
__attribute__((noinline)) void task_avx2(T* out, const T* qkv, const Sequence& sq, int64_t h,
                                         int64_t q0, int64_t num_heads, int64_t hidden, float scale,
                                         Scratch& sc) {
  attention_task<T, v8f, 8, 2, 4, 4>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

// The micro-kernels a call runs on, best first. BERTFAST_CPU_ATTENTION_ISA forces a
// lesser one (tests cover every path on one machine): "avx512bf16" = vdpbf16ps
// without AMX tiles, "avx512" = AVX-512 without bf16 dot products (bf16 storage then
// runs the fp32-math kernel), "avx2" = the AVX2 baseline. Read per call, so a test
// can set it in-process. The bf16 paths serve bf16 storage only.
enum class Isa { kAvx2, kAvx512, kAvx512Bf16, kAmxBf16 };

Isa attention_isa() {
#if defined(BF_X86)
  const char* env = std::getenv("BERTFAST_CPU_ATTENTION_ISA");
  const auto is = [env](const char* name) { return env && std::strcmp(env, name) == 0; };
  const Isa cap = is("avx2")         ? Isa::kAvx2
                  : is("avx512")     ? Isa::kAvx512
                  : is("avx512bf16") ? Isa::kAvx512Bf16
                                     : Isa::kAmxBf16;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  if (!avx512 || cap == Isa::kAvx2) return Isa::kAvx2;
  if (cap == Isa::kAvx512 || !__builtin_cpu_supports("avx512bf16")) return Isa::kAvx512;
  if (cap == Isa::kAvx512Bf16 || !amx_available()) return Isa::kAvx512Bf16;
  return Isa::kAmxBf16;
#else
  return Isa::kAvx2;
#endif
}

// One task on the chosen micro-kernels.
template <typename T>
BF_INLINE void run_task(Isa isa, T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0,
                        int64_t num_heads, int64_t hidden, float scale, Scratch& sc) {
#if defined(BF_X86)
  if constexpr (std::is_same_v<T, bf16>) {
    if (isa == Isa::kAmxBf16) {
      task_amx_bf16(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
      return;
    }
    if (isa == Isa::kAvx512Bf16) {
      task_avx512_bf16(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
      return;
    }
  }
#endif
  if (isa != Isa::kAvx2) {
    task_avx512<T>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  } else {
    task_avx2<T>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  }
}

template <typename T>
void attention_impl(T* out, const T* qkv, const std::vector<Sequence>& seqs, int64_t num_heads,
                    int64_t hidden, float scale, int num_threads) {
  const int64_t d = hidden / num_heads;
  std::vector<Task> tasks;
  int64_t work = 0;
  for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
    for (int64_t h = 0; h < num_heads; ++h)
      for (int64_t q0 = 0; q0 < seqs[s].len; q0 += BLOCK_M) tasks.push_back({s, h, q0});
    work += seqs[s].len * seqs[s].len * num_heads * d;
  }
  // Longest sequences first: with the dynamic schedule the short tasks left at the
  // end even out the threads of a ragged batch.
  std::stable_sort(tasks.begin(), tasks.end(), [&seqs](const Task& a, const Task& b) {
    return seqs[a.seq].len > seqs[b.seq].len;
  });
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
  if (ntasks == 0) return;
  int nt = threads_for(work, 1 << 16, num_threads);
  nt = static_cast<int>(std::min<int64_t>(nt, ntasks));
  const Isa isa = attention_isa();

#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#endif
  {
    Scratch sc;
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t t = 0; t < ntasks; ++t) {
      const Sequence& sq = seqs[tasks[t].seq];
      run_task<T>(isa, out, qkv, sq, tasks[t].head, tasks[t].q0, num_heads, hidden, scale, sc);
    }
  }
}

}  // namespace

void attention_padded(int dtype, void* out, const void* qkv, const uint8_t* mask, int64_t batch,
                      int64_t seqlen, int64_t num_heads, int64_t hidden, float scale,
                      int num_threads) {
  if (batch <= 0 || seqlen <= 0 || hidden <= 0) return;
  if (num_heads <= 0 || hidden % num_heads)
    throw std::invalid_argument("bertfast cpu attention: hidden not divisible by num_heads");
  std::vector<Sequence> seqs(batch);
  for (int64_t b = 0; b < batch; ++b)
    seqs[b] = {b * seqlen, seqlen, mask ? mask + b * seqlen : nullptr};
  BF_DISPATCH_DTYPE(dtype, T,
                    attention_impl<T>(static_cast<T*>(out), static_cast<const T*>(qkv), seqs,
                                      num_heads, hidden, scale, num_threads));
}

void attention_varlen(int dtype, void* out, const void* qkv, const int32_t* cu_seqlens,
                      int64_t batch, int64_t tokens, int64_t num_heads, int64_t hidden, float scale,
                      int num_threads) {
  if (num_heads <= 0 || hidden <= 0 || hidden % num_heads)
    throw std::invalid_argument("bertfast cpu attention_varlen: hidden not divisible by num_heads");
  // Bounds-safe whatever the caller checked: cu_seqlens must rise from 0 to tokens.
  if (batch < 0 || cu_seqlens[0] != 0 || cu_seqlens[batch] != tokens)
    throw std::out_of_range(
        "bertfast cpu attention_varlen: cu_seqlens must rise from 0 to the token count");
  std::vector<Sequence> seqs;
  seqs.reserve(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t a = cu_seqlens[b], e = cu_seqlens[b + 1];
    if (e < a || e > tokens)
      throw std::out_of_range("bertfast cpu attention_varlen: cu_seqlens is not non-decreasing");
    if (e > a) seqs.push_back({a, e - a, nullptr});
  }
  if (tokens <= 0) return;
  BF_DISPATCH_DTYPE(dtype, T,
                    attention_impl<T>(static_cast<T*>(out), static_cast<const T*>(qkv), seqs,
                                      num_heads, hidden, scale, num_threads));
}

}  // namespace cpu
}  // namespace bertfast
