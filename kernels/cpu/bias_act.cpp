// bias_act: out = act(x + bias) over a row-major [rows, cols] tensor (the FFN
// epilogue). act is GELU-erf, GELU-tanh or ReLU; out may alias x (in place).
//
// Threads: OpenMP, static split over rows. Each row is one unit-stride loop that
// vectorises (the erf / exp in common.h are branch-free polynomials, no libm calls).
// When there are fewer rows than threads (one long vector), the columns are split
// into chunks instead, so one row still uses every thread.
#include <vector>

#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {
namespace {

// Kept out of line: GCC vectorises it reliably as its own function, less so once
// inlined into the OpenMP-outlined region. BF_CLONES adds an AVX-512 (x86-64-v4)
// clone chosen at load time by the CPU it runs on; the default stays AVX2/FMA.
template <typename T, int ACT>
__attribute__((noinline)) BF_CLONES void act_span(T* out, const T* x, const float* BF_RESTRICT bias,
                                                  int64_t n) {
  // No BF_RESTRICT on out/x: they may alias (element j is read before it is written).
  for (int64_t j = 0; j < n; ++j) {
    out[j] = from_f32<T>(activate_for<ACT, T>(to_f32(x[j]) + bias[j]));
  }
}

template <typename T, int ACT>
__attribute__((noinline)) BF_CLONES void activate_span(float* BF_RESTRICT x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = activate_for<ACT, T>(x[j]);
}

template <typename T, int ACT>
void bias_act_impl(T* out, const T* x, const void* bias_ptr, int64_t rows, int64_t cols,
                   int num_threads) {
  std::vector<float> bias(cols, 0.0f);
  if (bias_ptr) {
    const T* b = static_cast<const T*>(bias_ptr);
    for (int64_t j = 0; j < cols; ++j) bias[j] = to_f32(b[j]);
  }
  const float* bptr = bias.data();
  const int nt = threads_for(rows * cols, 32768, num_threads);
  if (rows >= nt) {
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t r = 0; r < rows; ++r) act_span<T, ACT>(out + r * cols, x + r * cols, bptr, cols);
  } else {
    // Few long rows: split each row into column chunks (multiples of 64).
    const int64_t chunk = ((cols + nt - 1) / nt + 63) / 64 * 64;
    const int64_t nchunks = (cols + chunk - 1) / chunk;
    for (int64_t r = 0; r < rows; ++r) {
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
      for (int64_t c = 0; c < nchunks; ++c) {
        int64_t j0 = c * chunk;
        int64_t len = cols - j0 < chunk ? cols - j0 : chunk;
        act_span<T, ACT>(out + r * cols + j0, x + r * cols + j0, bptr + j0, len);
      }
    }
  }
}

template <typename T>
void bias_act_typed(T* out, const T* x, const void* bias, int64_t rows, int64_t cols, int act,
                    int num_threads) {
  dispatch_activation(act, [&](auto act_c) {
    bias_act_impl<T, decltype(act_c)::value>(out, x, bias, rows, cols, num_threads);
  });
}

}  // namespace

template <typename T>
void activate_inplace(int act, float* x, int64_t n) {
  dispatch_activation</*kWithNone=*/true>(
      act, [&](auto act_c) { activate_span<T, decltype(act_c)::value>(x, n); });
}
template void activate_inplace<float>(int act, float* x, int64_t n);
template void activate_inplace<bf16>(int act, float* x, int64_t n);

void bias_act(int dtype, void* out, const void* x, const void* bias, int64_t rows, int64_t cols,
              int activation, int num_threads) {
  if (rows <= 0 || cols <= 0) return;
  BF_DISPATCH_DTYPE(dtype, T,
                    bias_act_typed<T>(static_cast<T*>(out), static_cast<const T*>(x), bias, rows,
                                      cols, activation, num_threads));
}

}  // namespace cpu
}  // namespace bertfast
