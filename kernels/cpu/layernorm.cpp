// LayerNorm kernels: embed_layernorm (gather word + token type + position rows,
// sum, LayerNorm) and add_layernorm ("SkipLayerNorm": LayerNorm((x + bias) + residual)).
//
// Layout: row-major [rows, width] activations; weight / bias vectors [width].
// Threads: OpenMP, static split over rows (one row = one unit of work).
// Per row the summed input is materialised once in an fp32 scratch row (L1 for
// BERT widths), then statistics are two-pass over that row, shifted by its first
// element: mean first, then the mean of squared deviations, so a large common
// offset (1e4) costs no accuracy (torch's fp32 LayerNorm loses ~1e-2 there).
// All three passes are unit-stride loops over the row that vectorise (AVX2/FMA).
#include <limits>
#include <vector>

#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {
namespace {

// The sum of f(row[j]) over a row of n floats in 32 partial sums: four 8-lane vectors,
// each its own chain of adds (a single chain waits out the add latency at every step:
// perf put the variance sum's chain at a fifth of the kernel), added in a fixed order,
// then the tail (n % 32) in order. The same sums in the same order wherever it runs,
// so one result on every CPU. f maps a vector (v8f) or a float alike.
template <typename F>
BF_INLINE float row_sum(const float* BF_RESTRICT row, int64_t n, F f) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    // plain unaligned loads of a may_alias vector (a memcpy into a vector variable went
    // through the stack in 16-byte halves and stalled every reload)
    typedef float v8f_row __attribute__((vector_size(32), aligned(4), may_alias));
    const v8f_row* x = reinterpret_cast<const v8f_row*>(row + j);
    a0 += f(x[0]);
    a1 += f(x[1]);
    a2 += f(x[2]);
    a3 += f(x[3]);
  }
  const v8f s = (a0 + a1) + (a2 + a3);
  float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  float tail = 0.0f;
  for (; j < n; ++j) tail += f(row[j]);
  return total + tail;
}

// Normalises `row` (fp32, length n) and writes weight * xhat + bias to `out`.
template <typename T>
BF_INLINE void normalize_row(const float* BF_RESTRICT row, const float* BF_RESTRICT w,
                             const float* BF_RESTRICT b, T* BF_RESTRICT out, int64_t n, float eps) {
  // Shifted two-pass statistics: the first element is subtracted before summing,
  // so a large common offset (1e4) does not swamp the fp32 sum, then the variance is
  // the mean of squared deviations from the (shifted) mean.
  const float shift = row[0];
  const float sum = row_sum(row, n, [shift](auto v) { return v - shift; });
  const float mean_c = sum / static_cast<float>(n);
  const float sq = row_sum(row, n, [shift, mean_c](auto v) {
    const auto d = (v - shift) - mean_c;
    return d * d;
  });
  const float var = sq / static_cast<float>(n);
  const float rstd = 1.0f / std::sqrt(var + eps);
  for (int64_t j = 0; j < n; ++j)
    out[j] = from_f32<T>(((row[j] - shift) - mean_c) * rstd * w[j] + b[j]);
}

template <typename T>
void to_f32_vector(const void* src, float* dst, int64_t n) {
  const T* s = static_cast<const T*>(src);
  for (int64_t j = 0; j < n; ++j) dst[j] = to_f32(s[j]);
}

// Runs body(r, row) for every r in [0, rows), split statically over nt OpenMP
// threads; `row` is the calling thread's fp32 scratch row of n elements.
template <typename Body>
void for_each_row(int64_t rows, int64_t n, int nt, Body&& body) {
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#else
  (void)nt;
#endif
  {
    static thread_local std::vector<float> scratch;  // kept from call to call
    if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(n);
    float* BF_RESTRICT row = scratch.data();
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t r = 0; r < rows; ++r) body(r, row);
  }
}

template <typename T>
void add_layernorm_impl(T* out, const T* x, const T* residual, const void* bias_ptr,
                        const void* weight_ptr, const void* ln_bias_ptr, int64_t rows, int64_t n,
                        float eps, int num_threads) {
  // Parameters converted to fp32 once, shared read-only by every thread.
  std::vector<float> params(3 * n, 0.0f);
  float* bias = params.data();
  float* w = bias + n;
  float* b = w + n;
  if (bias_ptr) to_f32_vector<T>(bias_ptr, bias, n);
  to_f32_vector<T>(weight_ptr, w, n);
  to_f32_vector<T>(ln_bias_ptr, b, n);
  const int nt = threads_for(rows * n, 16384, num_threads);
  for_each_row(rows, n, nt, [&](int64_t r, float* BF_RESTRICT row) {
    const T* BF_RESTRICT xr = x + r * n;
    const T* BF_RESTRICT rr = residual + r * n;
    // Same association as the reference: (x + bias) + residual.
    for (int64_t j = 0; j < n; ++j) row[j] = (to_f32(xr[j]) + bias[j]) + to_f32(rr[j]);
    normalize_row(row, w, b, out + r * n, n, eps);
  });
}

template <typename T>
void embed_layernorm_impl(T* out, const int64_t* input_ids, const int64_t* position_ids,
                          const int64_t* token_type_ids, const T* word, int64_t vocab, const T* pos,
                          int64_t num_pos, const T* types, int64_t num_types,
                          const void* weight_ptr, const void* bias_ptr, int64_t tokens, int64_t n,
                          float eps, int num_threads) {
  std::vector<float> params(2 * n);
  float* w = params.data();
  float* b = w + n;
  to_f32_vector<T>(weight_ptr, w, n);
  to_f32_vector<T>(bias_ptr, b, n);
  const int nt = threads_for(tokens * n, 16384, num_threads);
  const T nan = from_f32<T>(std::numeric_limits<float>::quiet_NaN());
  for_each_row(tokens, n, nt, [&](int64_t t, float* BF_RESTRICT row) {
    T* BF_RESTRICT o = out + t * n;
    const int64_t id = input_ids[t];
    const int64_t p = position_ids[t];
    const int64_t tt = token_type_ids ? token_type_ids[t] : 0;
    // Bounds-safe whatever the caller checked: an out-of-range id gives a NaN row.
    if (id < 0 || id >= vocab || p < 0 || p >= num_pos || (types && (tt < 0 || tt >= num_types))) {
      for (int64_t j = 0; j < n; ++j) o[j] = nan;
      return;
    }
    const T* BF_RESTRICT wr = word + id * n;
    const T* BF_RESTRICT pr = pos + p * n;
    if (types) {
      const T* BF_RESTRICT tr = types + tt * n;
      // transformers' order: word, then token type, then position.
      for (int64_t j = 0; j < n; ++j) row[j] = (to_f32(wr[j]) + to_f32(tr[j])) + to_f32(pr[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = to_f32(wr[j]) + to_f32(pr[j]);
    }
    normalize_row(row, w, b, o, n, eps);
  });
}

}  // namespace

void add_layernorm(int dtype, void* out, const void* x, const void* residual, const void* bias,
                   const void* weight, const void* ln_bias, int64_t rows, int64_t hidden, float eps,
                   int num_threads) {
  if (rows <= 0 || hidden <= 0) return;
  BF_DISPATCH_DTYPE(dtype, T,
                    add_layernorm_impl<T>(static_cast<T*>(out), static_cast<const T*>(x),
                                          static_cast<const T*>(residual), bias, weight, ln_bias,
                                          rows, hidden, eps, num_threads));
}

void embed_layernorm(int dtype, void* out, const int64_t* input_ids, const int64_t* position_ids,
                     const int64_t* token_type_ids, const void* word, int64_t vocab,
                     const void* pos, int64_t num_pos, const void* types, int64_t num_types,
                     const void* weight, const void* bias, int64_t tokens, int64_t width, float eps,
                     int num_threads) {
  if (tokens <= 0 || width <= 0) return;
  if (types == nullptr) token_type_ids = nullptr;
  BF_DISPATCH_DTYPE(
      dtype, T,
      embed_layernorm_impl<T>(static_cast<T*>(out), input_ids, position_ids, token_type_ids,
                              static_cast<const T*>(word), vocab, static_cast<const T*>(pos),
                              num_pos, static_cast<const T*>(types), num_types, weight, bias,
                              tokens, width, eps, num_threads));
}

}  // namespace cpu
}  // namespace bertfast
