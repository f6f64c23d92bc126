// bias_gelu / bias_gelu_: out = act(round(x + bias)), act in erf GELU, tanh GELU, ReLU.
//
// Layout: x and out contiguous [rows, width] (out may alias x: in place), bias [width]
// or null. The sum x + bias is rounded to the storage type first, as the reference
// does; the activation is computed in fp32 and rounded once.
// Launch: 1-D grid-stride loop over vectors of VEC elements (a full 128-bit vector
// when width is a multiple of it and the pointers are 16-byte aligned, else 1).
#include <type_traits>

#include "common.cuh"
#include "launchers.cuh"

namespace bertfast {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <int ACT>
__device__ __forceinline__ float activate(float x) {
  if constexpr (ACT == kGeluErf) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  } else if constexpr (ACT == kGeluTanh) {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + tanhf(inner));
  } else {
    return x < 0.f ? 0.f : x;  // NaN stays NaN, as torch.relu
  }
}

template <typename T, int VEC, int ACT>
__global__ void bias_act_kernel(T* out, const T* x, const T* __restrict__ bias, int64_t num_vectors,
                                int64_t width) {
  // out and x may alias (in place): no __restrict__ on them, and each vector is
  // read completely before it is written by the same thread.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_vectors;
       i += stride) {
    const int64_t first = i * VEC;
    float v[VEC];
    load_vec<T, VEC>(x + first, v);
    if (bias != nullptr) {
      float b[VEC];
      load_vec<T, VEC>(bias + first % width, b);  // width % VEC == 0: one bias vector
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = round_to<T>(v[e] + b[e]);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = activate<ACT>(v[e]);
    store_vec<T, VEC>(out + first, v);
  }
}

template <typename T, int ACT>
cudaError_t bias_act_typed(void* out, const void* x, const void* bias, int64_t rows, int64_t width,
                           cudaStream_t stream) {
  constexpr int kVec = Vec16<T>::kElems;
  const bool vectorised = width % kVec == 0 && is_aligned16(out) && is_aligned16(x) &&
                          (bias == nullptr || is_aligned16(bias));
  const int64_t total = rows * width;
  auto run = [&](auto vec_c) -> cudaError_t {
    constexpr int VEC = decltype(vec_c)::value;
    const int64_t num_vectors = total / VEC;
    int64_t blocks = (num_vectors + kThreads - 1) / kThreads;
    if (blocks > (1 << 20)) blocks = 1 << 20;  // grid-stride beyond ~268M vectors
    bias_act_kernel<T, VEC, ACT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(bias), num_vectors,
        width);
    return cudaGetLastError();
  };
  if (vectorised) return run(std::integral_constant<int, kVec>{});
  return run(std::integral_constant<int, 1>{});
}

}  // namespace

cudaError_t launch_bias_act(void* out, const void* x, const void* bias, int64_t rows, int64_t width,
                            int activation, int dtype, cudaStream_t stream) {
  if (rows < 0 || width < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_activation(activation, [&](auto act) {
      return bias_act_typed<T, decltype(act)::value>(out, x, bias, rows, width, stream);
    });
  });
}

}  // namespace cuda
}  // namespace bertfast
