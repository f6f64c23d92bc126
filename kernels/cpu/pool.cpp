// pool_packed: one vector per sequence of packed fp32 rows h [T, H] (sequences back to
// back, cu_seqlens [B + 1] rising from 0 to T, each at least one row), optionally
// L2-normalised: what the Embedder's pooling (bertfast/embedder.py, pool_packed) and
// F.normalize compute, in one pass over the rows while they are still in cache.
//
//   cls            out[b] = h[cu[b]]
//   mean           out[b] = (h[cu[b]] + ... + h[cu[b + 1] - 1]) / n   (rows added in order)
//   mean_sqrt_len  the same sum / sqrt(n)
//   lasttoken      out[b] = h[cu[b + 1] - 1]
//   normalize      out[b] /= max(||out[b]||_2, 1e-12)  (NaN stays NaN, as in torch)
//
// One thread: B x H floats of output, a few microseconds at the sizes it is used for.
// The caller (csrc/cpu_ops.cpp) has checked every size and that each sequence has a row.
#include <cmath>

#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {

void pool_packed(float* out, const float* h, const int32_t* cu_seqlens, int64_t batch,
                 int64_t hidden, int mode, bool normalize) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = cu_seqlens[b], end = cu_seqlens[b + 1];
    float* BF_RESTRICT o = out + b * hidden;
    if (mode == kPoolCls || mode == kPoolLastToken) {
      const float* src = h + (mode == kPoolCls ? begin : end - 1) * hidden;
      for (int64_t j = 0; j < hidden; ++j) o[j] = src[j];
    } else {
      for (int64_t j = 0; j < hidden; ++j) o[j] = h[begin * hidden + j];
      for (int64_t r = begin + 1; r < end; ++r) {
        const float* BF_RESTRICT src = h + r * hidden;
        for (int64_t j = 0; j < hidden; ++j) o[j] += src[j];
      }
      const float n = static_cast<float>(end - begin);
      const float denom = mode == kPoolMean ? n : std::sqrt(n);
      for (int64_t j = 0; j < hidden; ++j) o[j] /= denom;
    }
    if (normalize) {
      float sq = 0.0f;
      for (int64_t j = 0; j < hidden; ++j) sq += o[j] * o[j];
      float norm = std::sqrt(sq);
      // written so that a NaN norm stays NaN (max(NaN, eps) would give eps)
      norm = norm < 1e-12f ? 1e-12f : norm;
      for (int64_t j = 0; j < hidden; ++j) o[j] /= norm;
    }
  }
}

}  // namespace cpu
}  // namespace bertfast
