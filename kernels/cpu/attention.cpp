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
//   (micro-kernels over 16 keys / 16 head dims x ROWS rows, accumulators in registers)
#include <algorithm>
#include <limits>
#include <vector>

#include "cpu/common.h"

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t BLOCK_M = 64;  // query rows per task
constexpr int64_t BLOCK_N = 64;  // keys per online-softmax step
constexpr int ROWS = 4;          // query rows per micro-tile
constexpr int KEYS_TILE = 16;    // keys per score accumulator tile (2 x 8 lanes)
constexpr int DIMS_TILE = 16;    // head dims per P.V accumulator tile (2 x 8 lanes)

// The two micro-kernels use GCC/Clang vector extensions (8 x fp32, one AVX2
// register; no intrinsics): with ROWS x 16 accumulators held in registers the
// compiler's own loop vectoriser would not keep them out of memory.
typedef float v8f __attribute__((vector_size(32), aligned(4)));  // aligned(4): unaligned loads ok

BF_INLINE v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }

struct Sequence {
  int64_t token0;       // first token (row of qkv / out)
  int64_t len;          // tokens (queries == keys)
  const uint8_t* mask;  // [len] nonzero = real token, or null (all real)
};

struct Task {
  int64_t seq, head, q0;
};

// s[r][j] = sum_dd q[r][dd] * kt[dd][j] for r < ROWS, j < BLOCK_N.
BF_INLINE void score_tile(const float* BF_RESTRICT q, const float* BF_RESTRICT kt, int64_t ldk,
                          int64_t d, int64_t dpad, float* BF_RESTRICT s) {
  for (int jc = 0; jc < BLOCK_N; jc += KEYS_TILE) {
    v8f acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = splat(0.0f);
    const float* BF_RESTRICT k = kt + jc;
    for (int64_t dd = 0; dd < d; ++dd, k += ldk) {
      const v8f k0 = *reinterpret_cast<const v8f*>(k);
      const v8f k1 = *reinterpret_cast<const v8f*>(k + 8);
      for (int r = 0; r < ROWS; ++r) {
        const v8f qv = splat(q[r * dpad + dd]);
        acc[r][0] += qv * k0;
        acc[r][1] += qv * k1;
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      *reinterpret_cast<v8f*>(s + r * BLOCK_N + jc) = acc[r][0];
      *reinterpret_cast<v8f*>(s + r * BLOCK_N + jc + 8) = acc[r][1];
    }
  }
}

// o[r][dd] = o[r][dd] * alpha[r] + sum_j p[r][j] * v[j][dd] for j < BLOCK_N.
BF_INLINE void pv_tile(const float* BF_RESTRICT p, const float* BF_RESTRICT v, int64_t dpad,
                       const float* BF_RESTRICT alpha, float* BF_RESTRICT o) {
  for (int64_t dc = 0; dc < dpad; dc += DIMS_TILE) {
    v8f acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      const v8f a = splat(alpha[r]);
      acc[r][0] = *reinterpret_cast<const v8f*>(o + r * dpad + dc) * a;
      acc[r][1] = *reinterpret_cast<const v8f*>(o + r * dpad + dc + 8) * a;
    }
    const float* BF_RESTRICT vr = v + dc;
    for (int64_t j = 0; j < BLOCK_N; ++j, vr += dpad) {
      const v8f v0 = *reinterpret_cast<const v8f*>(vr);
      const v8f v1 = *reinterpret_cast<const v8f*>(vr + 8);
      for (int r = 0; r < ROWS; ++r) {
        const v8f pj = splat(p[r * BLOCK_N + j]);
        acc[r][0] += pj * v0;
        acc[r][1] += pj * v1;
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      *reinterpret_cast<v8f*>(o + r * dpad + dc) = acc[r][0];
      *reinterpret_cast<v8f*>(o + r * dpad + dc + 8) = acc[r][1];
    }
  }
}

template <typename T>
void attention_impl(T* out, const T* qkv, const std::vector<Sequence>& seqs, int64_t num_heads,
                    int64_t hidden, float scale, int num_threads) {
  const int64_t d = hidden / num_heads;
  const int64_t dpad = (d + DIMS_TILE - 1) / DIMS_TILE * DIMS_TILE;
  const int64_t ld = 3 * hidden;
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
  const T zero = from_f32<T>(0.0f);

#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#endif
  {
    std::vector<int64_t> keys, qrows;
    std::vector<float> kt, vbuf;
    std::vector<float> qbuf(ROWS * dpad), obuf(ROWS * dpad), sbuf(ROWS * BLOCK_N);
    float m[ROWS], l[ROWS], alphas[ROWS];
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t t = 0; t < ntasks; ++t) {
      const Sequence& sq = seqs[tasks[t].seq];
      const int64_t h = tasks[t].head;
      const int64_t q0 = tasks[t].q0;
      const int64_t q1 = std::min(q0 + BLOCK_M, sq.len);
      const T* base = qkv + sq.token0 * ld;
      T* obase = out + sq.token0 * hidden + h * d;

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
      if (qrows.empty()) continue;

      // K^T and V of this head's real keys, fp32, zero-padded.
      const int64_t nkp = (nk + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
      if (static_cast<int64_t>(kt.size()) < d * nkp) kt.resize(d * nkp);
      if (static_cast<int64_t>(vbuf.size()) < nkp * dpad) vbuf.resize(nkp * dpad);
      float* BF_RESTRICT ktp = kt.data();
      float* BF_RESTRICT vp = vbuf.data();
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

      const int64_t nq = static_cast<int64_t>(qrows.size());
      for (int64_t g = 0; g < nq; g += ROWS) {
        const int nr = static_cast<int>(std::min<int64_t>(ROWS, nq - g));
        float* BF_RESTRICT qp = qbuf.data();
        float* BF_RESTRICT op = obuf.data();
        float* BF_RESTRICT sp = sbuf.data();
        std::fill(qbuf.begin(), qbuf.end(), 0.0f);
        std::fill(obuf.begin(), obuf.end(), 0.0f);
        for (int r = 0; r < nr; ++r) {
          const T* qrow = base + qrows[g + r] * ld + h * d;
          for (int64_t dd = 0; dd < d; ++dd) qp[r * dpad + dd] = to_f32(qrow[dd]) * scale;
        }
        for (int r = 0; r < ROWS; ++r) {
          m[r] = -std::numeric_limits<float>::infinity();
          l[r] = 0.0f;
        }
        for (int64_t kb = 0; kb < nkp; kb += BLOCK_N) {
          score_tile(qp, ktp + kb * d, BLOCK_N, d, dpad, sp);
          const int64_t valid = std::min<int64_t>(BLOCK_N, nk - kb);
          for (int r = 0; r < ROWS; ++r) {
            float* BF_RESTRICT sr = sp + r * BLOCK_N;
            for (int64_t j = valid; j < BLOCK_N; ++j) sr[j] = -std::numeric_limits<float>::infinity();
            float mx = -std::numeric_limits<float>::infinity();
            BF_SIMD_REDUCE_MAX(mx)
            for (int64_t j = 0; j < BLOCK_N; ++j) mx = fmax_(mx, sr[j]);
            const float m_new = fmax_(m[r], mx);
            const float alpha = fast_exp(m[r] - m_new);  // exp(-inf) == 0 on the first block
            float sum = 0.0f;
            BF_SIMD_REDUCE_ADD(sum)
            for (int64_t j = 0; j < BLOCK_N; ++j) {
              float p = fast_exp(sr[j] - m_new);
              sr[j] = p;
              sum += p;
            }
            l[r] = l[r] * alpha + sum;
            m[r] = m_new;
            alphas[r] = alpha;
          }
          pv_tile(sp, vp + kb * dpad, dpad, alphas, op);
        }
        for (int r = 0; r < nr; ++r) {
          const float inv = 1.0f / l[r];
          T* o = obase + qrows[g + r] * hidden;
          const float* BF_RESTRICT orow = op + r * dpad;
          for (int64_t dd = 0; dd < d; ++dd) o[dd] = from_f32<T>(orow[dd] * inv);
        }
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
