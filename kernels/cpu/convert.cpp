// convert: a contiguous run of n values from one storage dtype to another (fp32,
// bf16, fp16; kernels/constants.h codes), each value widened to fp32 and rounded
// once to the destination as every kernel rounds its output (common.h from_f32:
// nearest even; NaN stays NaN, inf stays inf). What the int8 model's bf16 attention
// runs on (csrc/cpu_ops.cpp, attention_varlen_bf16): the fp32 QKV rounded to bf16,
// and its bf16 output widened back, without a torch cast in between.
//
// Threads: OpenMP, static split over chunks of 16 Ki values; one thread below that.
#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t kChunk = 16384;

template <typename S, typename D>
__attribute__((noinline)) BF_CLONES void convert_span(D* BF_RESTRICT out, const S* BF_RESTRICT x,
                                                      int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = from_f32<D>(to_f32(x[j]));
}

template <typename S, typename D>
void convert_impl(D* out, const S* x, int64_t n, int num_threads) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int nt = threads_for(n, kChunk, num_threads);
  (void)nt;
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, len = n - begin < kChunk ? n - begin : kChunk;
    convert_span<S, D>(out + begin, x + begin, len);
  }
}

}  // namespace

void convert(int src_dtype, int dst_dtype, void* out, const void* x, int64_t n, int num_threads) {
  if (n <= 0) return;
  BF_DISPATCH_DTYPE(
      src_dtype, S,
      BF_DISPATCH_DTYPE(
          dst_dtype, D,
          convert_impl<S, D>(static_cast<D*>(out), static_cast<const S*>(x), n, num_threads)));
}

}  // namespace cpu
}  // namespace bertfast
