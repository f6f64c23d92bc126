// The fp32-math micro-kernels of the CPU attention (driver: attention.cpp): every
// storage dtype (fp32, fp16, bf16) converted to fp32 in scratch, fp32 products and
// sums. Variants for AVX-512 and AVX2/FMA, chosen per call by the driver.
//
// Masked keys are simply left out when a task copies its head's keys (prefetching
// the strided token rows ahead), so no score is ever masked.
//
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
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/attention_internal.h"
#include "cpu/common.h"

namespace bertfast {
namespace cpu {
namespace attn {
namespace {

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

}  // namespace

template <typename T>
void run_fp32_task(bool avx512, T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0,
                   int64_t num_heads, int64_t hidden, float scale, Scratch& sc) {
  if (avx512) {
    task_avx512<T>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  } else {
    task_avx2<T>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
  }
}

template void run_fp32_task<float>(bool, float*, const float*, const Sequence&, int64_t, int64_t,
                                   int64_t, int64_t, float, Scratch&);
template void run_fp32_task<f16>(bool, f16*, const f16*, const Sequence&, int64_t, int64_t, int64_t,
                                 int64_t, float, Scratch&);
template void run_fp32_task<bf16>(bool, bf16*, const bf16*, const Sequence&, int64_t, int64_t,
                                  int64_t, int64_t, float, Scratch&);

}  // namespace attn
}  // namespace cpu
}  // namespace bertfast
