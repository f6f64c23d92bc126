// embed_layernorm and add_layernorm: a fused row-wise sum followed by LayerNorm.
//
//   embed_layernorm: out[r] = LN(round(round(word[id] + type[tt]) + pos[p]))
//   add_layernorm:   out[r] = LN(round(round(x[r] + bias) + residual[r]))
//
// "round" is a rounding to the storage type, as torch does between the adds of
// the reference (bertfast/ops/reference.py); LN statistics are fp32, two-pass
// (mean, then mean of squared deviations) over the row held in registers.
//
// Layout: every tensor contiguous, rows of `width` elements.
// Launch: a row per warp (block 32x4, four rows per block) when width <= 1024,
// else a row per block (256 threads, or 512 when width > 8192; widths up to
// 16384). Each thread
// holds CHUNKS vectors of VEC elements: vector j = c * blockDim.x + threadIdx.x
// covers elements [j*VEC, j*VEC + VEC). VEC is a full 128-bit vector when the
// width is a multiple of it and every pointer is 16-byte aligned, else 1
// (scalar, coalesced). CHUNKS * VEC <= 32 floats per thread.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "launchers.cuh"

namespace bertfast {
namespace cuda {
namespace {

constexpr int kRowsPerWarpBlock = 4;     // warp-per-row blocks are 32 x 4
constexpr int kMaxWarpRowWidth = 1024;   // 32 lanes x 32 floats
constexpr int kMaxBlock256Width = 8192;  // 256 threads x 32 floats
// Widest blocks: 512 threads x 32 floats = 16384 (kMaxLayerNormWidth). 512
// threads leave 128 registers per thread, well above what a 32-float row slice
// needs (<= 80 with nvcc 13), so no instantiation spills.
constexpr int kMaxThreads = 512;

// Mean/variance of the row in v (slots past the width are ignored), then
// out = (v - mean) * rstd * weight + bias, written in T.
template <typename T, int VEC, int CHUNKS>
__device__ __forceinline__ void normalize_row(float (&v)[CHUNKS][VEC], T* __restrict__ out_row,
                                              const T* __restrict__ weight,
                                              const T* __restrict__ bias, int width, float eps,
                                              float* scratch) {
  const int t = threadIdx.x;
  const int group = blockDim.x;
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int j = c * group + t;
    if (j * VEC < width) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += v[c][e];
    }
  }
  const float mean = row_group_sum(sum, scratch) / static_cast<float>(width);
  float sq = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int j = c * group + t;
    if (j * VEC < width) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float d = v[c][e] - mean;
        sq += d * d;
      }
    }
  }
  const float var = row_group_sum(sq, scratch) / static_cast<float>(width);
  const float rstd = rsqrtf(var + eps);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int j = c * group + t;
    if (j * VEC < width) {
      float w[VEC], b[VEC], y[VEC];
      load_vec<T, VEC>(weight + j * VEC, w);
      load_vec<T, VEC>(bias + j * VEC, b);
#pragma unroll
      for (int e = 0; e < VEC; ++e) y[e] = (v[c][e] - mean) * rstd * w[e] + b[e];
      store_vec<T, VEC>(out_row + j * VEC, y);
    }
  }
}

// v = round(round(a + b) + c) over this thread's slice of a row, b skipped when
// null (v = round(a + c)); slots past the width are zero. a, b, c are rows of
// `width` elements: the word/type/position rows of embed_layernorm, or the
// x/bias/residual rows of add_layernorm.
template <typename T, int VEC, int CHUNKS>
__device__ __forceinline__ void load_row_sum(float (&v)[CHUNKS][VEC], const T* __restrict__ a_row,
                                             const T* __restrict__ b_row,
                                             const T* __restrict__ c_row, int width) {
  const int t = threadIdx.x;
  const int group = blockDim.x;
  const bool has_b = b_row != nullptr;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int j = c * group + t;
    if (j * VEC < width) {
      float a[VEC], b[VEC];
      load_vec<T, VEC>(a_row + j * VEC, a);
      if (has_b) {
        load_vec<T, VEC>(b_row + j * VEC, b);
#pragma unroll
        for (int e = 0; e < VEC; ++e) a[e] = round_to<T>(a[e] + b[e]);
      }
      load_vec<T, VEC>(c_row + j * VEC, b);
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[c][e] = round_to<T>(a[e] + b[e]);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[c][e] = 0.f;
    }
  }
}

template <typename T, int VEC, int CHUNKS>
__global__ void __launch_bounds__(kMaxThreads)
    embed_layernorm_kernel(T* __restrict__ out, const int64_t* __restrict__ input_ids,
                           const int64_t* __restrict__ position_ids,
                           const int64_t* __restrict__ token_type_ids, const T* __restrict__ word,
                           const T* __restrict__ pos, const T* __restrict__ types,
                           const T* __restrict__ weight, const T* __restrict__ bias, int64_t rows,
                           int width, int64_t vocab, int64_t max_positions, int64_t type_vocab,
                           float eps) {
  __shared__ float scratch[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // a whole warp (warp path) or block (block path) leaves together
  const int t = threadIdx.x;
  const int group = blockDim.x;
  T* out_row = out + row * width;

  const int64_t id = input_ids[row];
  const int64_t p = position_ids[row];
  const bool has_types = types != nullptr;
  const int64_t tt = has_types ? token_type_ids[row] : 0;
  const bool in_range = id >= 0 && id < vocab && p >= 0 && p < max_positions &&
                        (!has_types || (tt >= 0 && tt < type_vocab));
  if (!in_range) {
    // Never read out of bounds: the row becomes NaN (same decision for every
    // thread of the row, so no reduction below is left half-entered).
    float nan_row[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) nan_row[e] = __int_as_float(0x7fc00000);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int j = c * group + t;
      if (j * VEC < width) store_vec<T, VEC>(out_row + j * VEC, nan_row);
    }
    return;
  }

  const T* word_row = word + id * width;
  const T* pos_row = pos + p * width;
  const T* type_row = has_types ? types + tt * width : nullptr;
  float v[CHUNKS][VEC];
  load_row_sum<T, VEC, CHUNKS>(v, word_row, type_row, pos_row, width);
  normalize_row<T, VEC, CHUNKS>(v, out_row, weight, bias, width, eps, scratch);
}

template <typename T, int VEC, int CHUNKS>
__global__ void __launch_bounds__(kMaxThreads)
    add_layernorm_kernel(T* __restrict__ out, const T* __restrict__ x,
                         const T* __restrict__ residual, const T* __restrict__ bias,
                         const T* __restrict__ weight, const T* __restrict__ ln_bias, int64_t rows,
                         int width, float eps) {
  __shared__ float scratch[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  float v[CHUNKS][VEC];
  load_row_sum<T, VEC, CHUNKS>(v, x + row * width, bias, residual + row * width, width);
  normalize_row<T, VEC, CHUNKS>(v, out + row * width, weight, ln_bias, width, eps, scratch);
}

// ---------------------------------------------------------------- host side
struct RowLaunch {
  dim3 grid;
  dim3 block;
  int chunks;  // power of two, chunks * vec <= 32
};

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

RowLaunch row_launch(int64_t rows, int64_t width, int vec) {
  RowLaunch l;
  const int64_t nvec = (width + vec - 1) / vec;
  if (width <= kMaxWarpRowWidth) {
    l.block = dim3(32, kRowsPerWarpBlock);
    l.grid = dim3(static_cast<unsigned>((rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock));
    l.chunks = next_pow2((nvec + 31) / 32);
  } else {
    const int threads = width <= kMaxBlock256Width ? 256 : kMaxThreads;
    l.block = dim3(threads, 1);
    l.grid = dim3(static_cast<unsigned>(rows));
    l.chunks = next_pow2((nvec + threads - 1) / threads);
  }
  return l;
}

// Calls f(std::integral_constant<int, CHUNKS>) for the runtime chunk count,
// instantiating only CHUNKS * VEC <= 32.
template <int VEC, typename F>
cudaError_t with_chunks(int chunks, F&& f) {
  switch (chunks) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      if constexpr (2 * VEC <= 32) return f(std::integral_constant<int, 2>{});
      break;
    case 4:
      if constexpr (4 * VEC <= 32) return f(std::integral_constant<int, 4>{});
      break;
    case 8:
      if constexpr (8 * VEC <= 32) return f(std::integral_constant<int, 8>{});
      break;
    case 16:
      if constexpr (16 * VEC <= 32) return f(std::integral_constant<int, 16>{});
      break;
    case 32:
      if constexpr (32 * VEC <= 32) return f(std::integral_constant<int, 32>{});
      break;
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

// Launches a row kernel: VEC is a full 16-byte vector of T when `vectorised`, else
// 1; the launch shape and CHUNKS follow from rows and width (row_launch). Calls
// launch(vec_c, chunks_c, l) with VEC and CHUNKS as std::integral_constant, then
// returns the launch's error.
template <typename T, typename Launch>
cudaError_t launch_row_kernel(bool vectorised, int64_t rows, int64_t width, Launch&& launch) {
  auto run = [&](auto vec_c) -> cudaError_t {
    constexpr int VEC = decltype(vec_c)::value;
    const RowLaunch l = row_launch(rows, width, VEC);
    return with_chunks<VEC>(l.chunks, [&](auto chunks_c) -> cudaError_t {
      launch(vec_c, chunks_c, l);
      return cudaGetLastError();
    });
  };
  if (vectorised) return run(std::integral_constant<int, Vec16<T>::kElems>{});
  return run(std::integral_constant<int, 1>{});
}

template <typename T>
cudaError_t embed_layernorm_typed(void* out, const int64_t* input_ids, const int64_t* position_ids,
                                  const int64_t* token_type_ids, const void* word, const void* pos,
                                  const void* types, const void* weight, const void* bias,
                                  int64_t rows, int64_t width, int64_t vocab, int64_t max_positions,
                                  int64_t type_vocab, float eps, cudaStream_t stream) {
  constexpr int kVec = Vec16<T>::kElems;
  const bool vectorised = width % kVec == 0 && is_aligned16(out) && is_aligned16(word) &&
                          is_aligned16(pos) && (types == nullptr || is_aligned16(types)) &&
                          is_aligned16(weight) && is_aligned16(bias);
  return launch_row_kernel<T>(
      vectorised, rows, width, [&](auto vec_c, auto chunks_c, const RowLaunch& l) {
        constexpr int VEC = decltype(vec_c)::value;
        constexpr int CHUNKS = decltype(chunks_c)::value;
        embed_layernorm_kernel<T, VEC, CHUNKS><<<l.grid, l.block, 0, stream>>>(
            static_cast<T*>(out), input_ids, position_ids, token_type_ids,
            static_cast<const T*>(word), static_cast<const T*>(pos), static_cast<const T*>(types),
            static_cast<const T*>(weight), static_cast<const T*>(bias), rows,
            static_cast<int>(width), vocab, max_positions, type_vocab, eps);
      });
}

template <typename T>
cudaError_t add_layernorm_typed(void* out, const void* x, const void* residual, const void* bias,
                                const void* weight, const void* ln_bias, int64_t rows,
                                int64_t width, float eps, cudaStream_t stream) {
  constexpr int kVec = Vec16<T>::kElems;
  const bool vectorised = width % kVec == 0 && is_aligned16(out) && is_aligned16(x) &&
                          is_aligned16(residual) && (bias == nullptr || is_aligned16(bias)) &&
                          is_aligned16(weight) && is_aligned16(ln_bias);
  return launch_row_kernel<T>(
      vectorised, rows, width, [&](auto vec_c, auto chunks_c, const RowLaunch& l) {
        constexpr int VEC = decltype(vec_c)::value;
        constexpr int CHUNKS = decltype(chunks_c)::value;
        add_layernorm_kernel<T, VEC, CHUNKS><<<l.grid, l.block, 0, stream>>>(
            static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(residual),
            static_cast<const T*>(bias), static_cast<const T*>(weight),
            static_cast<const T*>(ln_bias), rows, static_cast<int>(width), eps);
      });
}

bool layernorm_shape_ok(int64_t rows, int64_t width) {
  // grid.x is at most 2^31 - 1 blocks (one row per block on the block path).
  return width >= 1 && width <= kMaxLayerNormWidth && rows >= 0 && rows <= kMaxCudaRows;
}

}  // namespace

cudaError_t launch_embed_layernorm(void* out, const int64_t* input_ids, const int64_t* position_ids,
                                   const int64_t* token_type_ids, const void* word, const void* pos,
                                   const void* types, const void* weight, const void* bias,
                                   int64_t rows, int64_t width, int64_t vocab,
                                   int64_t max_positions, int64_t type_vocab, float eps, int dtype,
                                   cudaStream_t stream) {
  if (!layernorm_shape_ok(rows, width)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return embed_layernorm_typed<T>(out, input_ids, position_ids, token_type_ids, word, pos, types,
                                    weight, bias, rows, width, vocab, max_positions, type_vocab,
                                    eps, stream);
  });
}

cudaError_t launch_add_layernorm(void* out, const void* x, const void* residual, const void* bias,
                                 const void* weight, const void* ln_bias, int64_t rows,
                                 int64_t width, float eps, int dtype, cudaStream_t stream) {
  if (!layernorm_shape_ok(rows, width)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return add_layernorm_typed<T>(out, x, residual, bias, weight, ln_bias, rows, width, eps,
                                  stream);
  });
}

}  // namespace cuda
}  // namespace bertfast
