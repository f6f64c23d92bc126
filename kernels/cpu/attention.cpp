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
// scratch, K transposed ([key blocks][d][BLOCK_N], keys padded to BLOCK_N) and V ([keys][dpad],
// head_dim padded to a multiple of 16) - O(S * d) memory, whatever the storage
// dtype. Masked keys are simply left out, so no score is ever masked except the
// tail of the last key block. Then ROWS query rows at a time go through the key
// blocks with an online softmax (fp32 running max and sum):
//   scores  s[ROWS][BLOCK_N] = q . Kt
//   p = exp(s - m_new), l = l * alpha + sum p, o = o * alpha + p V
//   (micro-kernels over 2 vectors of keys / head dims x ROWS rows, accumulators in
//   registers; AVX-512 or AVX2 variant chosen at run time, see below)
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/common.h"

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t BLOCK_M = 256;  // query rows per task (K / V are packed once per task)
constexpr int64_t BLOCK_N = 128;  // keys per online-softmax step

// The two micro-kernels use GCC/Clang vector extensions (no intrinsics): with
// ROWS x 2 accumulators held in registers the compiler's own loop vectoriser would
// not keep them out of memory. Two variants chosen at run time from the CPU:
//   AVX-512 (x86-64-v4): 16 lanes, ROWS = 8 (16 zmm accumulators), head_dim padded to 32
//   AVX2/FMA (baseline):  8 lanes, ROWS = 4 (8 ymm accumulators), head_dim padded to 16
// One micro-tile covers 2 vectors of keys (scores) or head dims (P.V).
typedef float v8f __attribute__((vector_size(32), aligned(4)));   // aligned(4): unaligned loads ok
typedef float v16f __attribute__((vector_size(64), aligned(4)));

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

template <typename V>
BF_INLINE V splat(float x) {
  V v = {};
  return v + x;
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
};

// s[r][j] = sum_dd q[r][dd] * kt[dd][j] for r < ROWS, j < nkeys rounded up to 2 VL
// (nkeys <= BLOCK_N; s[r][j] beyond that is left as it was).
template <typename V, int VL, int ROWS>
BF_INLINE void score_tile(const float* BF_RESTRICT q, const float* BF_RESTRICT kt, int64_t ldk,
                          int64_t d, int64_t dpad, int64_t nkeys, float* BF_RESTRICT s) {
  for (int jc = 0; jc < nkeys; jc += 2 * VL) {
    V acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = V{};
    const float* BF_RESTRICT k = kt + jc;
    for (int64_t dd = 0; dd < d; ++dd, k += ldk) {
      const V k0 = load_v<V>(k);
      const V k1 = load_v<V>(k + VL);
      for (int r = 0; r < ROWS; ++r) {
        const V qv = splat<V>(q[r * dpad + dd]);
        acc[r][0] += qv * k0;
        acc[r][1] += qv * k1;
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      store_v<V>(s + r * BLOCK_N + jc, acc[r][0]);
      store_v<V>(s + r * BLOCK_N + jc + VL, acc[r][1]);
    }
  }
}

// o[r][dd] = o[r][dd] * alpha[r] + sum_j p[r][j] * v[j][dd] for j < nkeys.
template <typename V, int VL, int ROWS>
BF_INLINE void pv_tile(const float* BF_RESTRICT p, const float* BF_RESTRICT v, int64_t dpad,
                       int64_t nkeys, const float* BF_RESTRICT alpha, float* BF_RESTRICT o) {
  for (int64_t dc = 0; dc < dpad; dc += 2 * VL) {
    V acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      const V a = splat<V>(alpha[r]);
      acc[r][0] = load_v<V>(o + r * dpad + dc) * a;
      acc[r][1] = load_v<V>(o + r * dpad + dc + VL) * a;
    }
    const float* BF_RESTRICT vr = v + dc;
    for (int64_t j = 0; j < nkeys; ++j, vr += dpad) {
      const V v0 = load_v<V>(vr);
      const V v1 = load_v<V>(vr + VL);
      for (int r = 0; r < ROWS; ++r) {
        const V pj = splat<V>(p[r * BLOCK_N + j]);
        acc[r][0] += pj * v0;
        acc[r][1] += pj * v1;
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      store_v<V>(o + r * dpad + dc, acc[r][0]);
      store_v<V>(o + r * dpad + dc + VL, acc[r][1]);
    }
  }
}

// One task: query rows [q0, q0 + BLOCK_M) of head h of sequence sq.
template <typename T, typename V, int VL, int ROWS>
BF_INLINE void attention_task(T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0,
                              int64_t num_heads, int64_t hidden, float scale, Scratch& sc) {
  const int64_t d = hidden / num_heads;
  const int64_t dpad = (d + 2 * VL - 1) / (2 * VL) * (2 * VL);
  const int64_t ld = 3 * hidden;
  const T zero = from_f32<T>(0.0f);
  const int64_t q1 = std::min(q0 + BLOCK_M, sq.len);
  const T* base = qkv + sq.token0 * ld;
  T* obase = out + sq.token0 * hidden + h * d;

  std::vector<int64_t>& keys = sc.keys;
  std::vector<int64_t>& qrows = sc.qrows;
  keys.clear();
  for (int64_t j = 0; j < sq.len; ++j)
    if (!sq.mask || sq.mask[j]) keys.push_back(j);
  const int64_t nk = static_cast<int64_t>(keys.size());
  qrows.clear();
  for (int64_t i = q0; i < q1; ++i) {
    if (nk > 0 && (!sq.mask || sq.mask[i])) {
      qrows.push_back(i);
    } else {
      T* o = obase + i * hidden;  // padded query row (or no key at all): zeros
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = zero;
    }
  }
  if (qrows.empty()) return;

  // K^T and V of this head's real keys, fp32, zero-padded.
  const int64_t nkp = (nk + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
  if (static_cast<int64_t>(sc.kt.size()) < d * nkp) sc.kt.resize(d * nkp);
  if (static_cast<int64_t>(sc.vbuf.size()) < nkp * dpad) sc.vbuf.resize(nkp * dpad);
  if (static_cast<int64_t>(sc.qbuf.size()) < ROWS * dpad) sc.qbuf.resize(ROWS * dpad);
  if (static_cast<int64_t>(sc.obuf.size()) < ROWS * dpad) sc.obuf.resize(ROWS * dpad);
  if (static_cast<int64_t>(sc.sbuf.size()) < ROWS * BLOCK_N) sc.sbuf.resize(ROWS * BLOCK_N);
  float* BF_RESTRICT ktp = sc.kt.data();
  float* BF_RESTRICT vp = sc.vbuf.data();
  for (int64_t jj = 0; jj < nk; ++jj) {
    const T* krow = base + keys[jj] * ld + hidden + h * d;
    const T* vrow = base + keys[jj] * ld + 2 * hidden + h * d;
    // K^T stored per key block, [nkp / BLOCK_N][d][BLOCK_N]: each block is contiguous
    // (a [d][nkp] layout strides by nkp floats, a power of two that thrashes L1 sets).
    float* BF_RESTRICT kcol = ktp + (jj / BLOCK_N) * d * BLOCK_N + (jj % BLOCK_N);
    for (int64_t dd = 0; dd < d; ++dd) kcol[dd * BLOCK_N] = to_f32(krow[dd]);
    float* BF_RESTRICT vr = vp + jj * dpad;
    for (int64_t dd = 0; dd < d; ++dd) vr[dd] = to_f32(vrow[dd]);
    for (int64_t dd = d; dd < dpad; ++dd) vr[dd] = 0.0f;
  }
  for (int64_t dd = 0; dd < d; ++dd)
    for (int64_t jj = nk; jj < nkp; ++jj)
      ktp[(jj / BLOCK_N) * d * BLOCK_N + dd * BLOCK_N + (jj % BLOCK_N)] = 0.0f;
  for (int64_t jj = nk; jj < nkp; ++jj)
    for (int64_t dd = 0; dd < dpad; ++dd) vp[jj * dpad + dd] = 0.0f;

  float m[ROWS], l[ROWS], alphas[ROWS];
  const int64_t nq = static_cast<int64_t>(qrows.size());
  for (int64_t g = 0; g < nq; g += ROWS) {
    const int nr = static_cast<int>(std::min<int64_t>(ROWS, nq - g));
    float* BF_RESTRICT qp = sc.qbuf.data();
    float* BF_RESTRICT op = sc.obuf.data();
    float* BF_RESTRICT sp = sc.sbuf.data();
    std::fill(qp, qp + ROWS * dpad, 0.0f);
    std::fill(op, op + ROWS * dpad, 0.0f);
    for (int r = 0; r < nr; ++r) {
      const T* qrow = base + qrows[g + r] * ld + h * d;
      for (int64_t dd = 0; dd < d; ++dd) qp[r * dpad + dd] = to_f32(qrow[dd]) * scale;
    }
    for (int r = 0; r < ROWS; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
    }
    for (int64_t kb = 0; kb < nkp; kb += BLOCK_N) {
      // The last block computes only its real keys (rounded up to a micro-tile);
      // the scores past them are set to -inf below.
      const int64_t valid = std::min<int64_t>(BLOCK_N, nk - kb);
      score_tile<V, VL, ROWS>(qp, ktp + kb * d, BLOCK_N, d, dpad, valid, sp);
      for (int r = 0; r < ROWS; ++r) {
        float* BF_RESTRICT sr = sp + r * BLOCK_N;
        for (int64_t j = valid; j < BLOCK_N; ++j) sr[j] = -std::numeric_limits<float>::infinity();
        float mx = -std::numeric_limits<float>::infinity();
        BF_SIMD_REDUCE_MAX(mx)
        for (int64_t j = 0; j < BLOCK_N; ++j) mx = fmax_(mx, sr[j]);
        const float m_new = fmax_(m[r], mx);
        // Non-finite scores propagate as in torch's softmax, with nothing added to
        // the loops: fast_exp(NaN) is NaN, so a NaN score (NaN in q, k or scale)
        // makes its p, the row sum and the row NaN whatever the max reduction did
        // with it; a +inf score gives p = exp(inf - inf) = NaN. While every score
        // so far is -inf, the offset is 0 instead of -inf (exp(-inf - -inf) would
        // be NaN): those keys get p = 0, and a row whose real scores are all -inf
        // ends with l = 0 and is written as p V = 0 (torch's SDPA: zeros; NaN
        // still where V holds inf or NaN, as 0 * inf in torch).
        const float m_off = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
        const float alpha = fast_exp(m[r] - m_off);  // exp(-inf) == 0 on the first block
        float sum = 0.0f;
        BF_SIMD_REDUCE_ADD(sum)
        for (int64_t j = 0; j < BLOCK_N; ++j) {
          float p = fast_exp(sr[j] - m_off);
          sr[j] = p;
          sum += p;
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        alphas[r] = alpha;
      }
      pv_tile<V, VL, ROWS>(sp, vp + kb * dpad, dpad, valid, alphas, op);
    }
    for (int r = 0; r < nr; ++r) {
      const float inv = l[r] == 0.0f ? 1.0f : 1.0f / l[r];  // l == 0: all scores -inf
      T* o = obase + qrows[g + r] * hidden;
      const float* BF_RESTRICT orow = op + r * dpad;
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = from_f32<T>(orow[dd] * inv);
    }
  }
}

// Per-task entry points, one per instruction set. The OpenMP loop stays outside
// them (an outlined parallel region would not inherit the target attribute).
// prefer-vector-width=512: the softmax loops in 16 lanes too.
template <typename T>
__attribute__((target("arch=x86-64-v4,prefer-vector-width=512"))) __attribute__((noinline)) void task_avx512(
    T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0, int64_t num_heads,
    int64_t hidden, float scale, Scratch& sc) {
  attention_task<T, v16f, 16, 8>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

template <typename T>
__attribute__((noinline)) void task_avx2(T* out, const T* qkv, const Sequence& sq, int64_t h,
                                         int64_t q0, int64_t num_heads, int64_t hidden,
                                         float scale, Scratch& sc) {
  attention_task<T, v8f, 8, 4>(out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

// BERTFAST_CPU_ATTENTION_ISA=avx2 forces the AVX2 micro-kernels on an AVX-512
// machine (tests cover both paths); read per call, so a test can set it in-process.
bool use_avx512() {
#if defined(__GNUC__) && defined(__x86_64__)
  const char* isa = std::getenv("BERTFAST_CPU_ATTENTION_ISA");
  if (isa && std::strcmp(isa, "avx2") == 0) return false;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
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
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
  if (ntasks == 0) return;
  int nt = threads_for(work, 1 << 16, num_threads);
  nt = static_cast<int>(std::min<int64_t>(nt, ntasks));
  const bool avx512 = use_avx512();

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
      if (avx512) {
        task_avx512<T>(out, qkv, sq, tasks[t].head, tasks[t].q0, num_heads, hidden, scale, sc);
      } else {
        task_avx2<T>(out, qkv, sq, tasks[t].head, tasks[t].q0, num_heads, hidden, scale, sc);
      }
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
  for (int64_t b = 0; b < batch; ++b) seqs[b] = {b * seqlen, seqlen, mask ? mask + b * seqlen : nullptr};
  BF_DISPATCH_DTYPE(dtype, T,
                    attention_impl<T>(static_cast<T*>(out), static_cast<const T*>(qkv), seqs,
                                      num_heads, hidden, scale, num_threads));
}

void attention_varlen(int dtype, void* out, const void* qkv, const int32_t* cu_seqlens,
                      int64_t batch, int64_t tokens, int64_t num_heads, int64_t hidden,
                      float scale, int num_threads) {
  if (num_heads <= 0 || hidden <= 0 || hidden % num_heads)
    throw std::invalid_argument("bertfast cpu attention_varlen: hidden not divisible by num_heads");
  // Bounds-safe whatever the caller checked: cu_seqlens must rise from 0 to tokens.
  if (batch < 0 || cu_seqlens[0] != 0 || cu_seqlens[batch] != tokens)
    throw std::out_of_range("bertfast cpu attention_varlen: cu_seqlens must rise from 0 to the token count");
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
