// Shared device helpers of the CUDA kernels in kernels/cuda/ (device code only;
// host-side launcher declarations live in launchers.cuh, which plain C++ includes).
//
// Storage types: float, __half, __nv_bfloat16. Every kernel computes in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "constants.h"

namespace bertfast {
namespace cuda {

// ---------------------------------------------------------------- dispatch
// The one place a runtime code becomes a template argument. `f` is a generic
// lambda returning cudaError_t; an unknown code gives cudaErrorInvalidValue.
template <typename T>
struct TypeTag {
  using type = T;
};

// f(TypeTag<float | __half | __nv_bfloat16>) for a DType code (constants.h).
template <typename F>
cudaError_t dispatch_dtype(int dtype, F&& f) {
  switch (dtype) {
    case kFloat32:
      return f(TypeTag<float>{});
    case kFloat16:
      return f(TypeTag<__half>{});
    case kBFloat16:
      return f(TypeTag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// f(std::integral_constant<int, ACT>) for an Activation code (constants.h).
template <typename F>
cudaError_t dispatch_activation(int activation, F&& f) {
  return visit_activation<false>(activation, f,
                                 []() -> cudaError_t { return cudaErrorInvalidValue; });
}

// f(std::integral_constant<int, V>) for the V of the list equal to `value`.
template <int... V, typename F>
cudaError_t dispatch_int(IntList<V...>, int value, F&& f) {
  cudaError_t err = cudaErrorInvalidValue;
  (void)((value == V ? (err = f(std::integral_constant<int, V>{}), true) : false) || ...);
  return err;
}

// ---------------------------------------------------------------- conversions
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x rounded to the storage type T and back: what an op computed in T by torch
// (one fp32 operation, one rounding) leaves behind.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// Elements of T in one 128-bit vector.
template <typename T>
struct Vec16 {
  static constexpr int kElems = 16 / sizeof(T);
};

// A 128-bit register image viewed as T[kElems].
template <typename T>
union Pack16 {
  uint4 raw;
  T elem[Vec16<T>::kElems];
};

// Copy N elements of T through a register array, with one 128-bit access when
// VEC == Vec16<T>::kElems (the caller guarantees 16-byte alignment then) and
// scalar accesses otherwise (VEC == 1).
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* __restrict__ ptr, float (&out)[VEC]) {
  if constexpr (VEC == Vec16<T>::kElems) {
    Pack16<T> p;
    p.raw = __ldg(reinterpret_cast<const uint4*>(ptr));
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = to_float(p.elem[e]);
  } else {
    static_assert(VEC == 1, "VEC is 1 or a whole 128-bit vector");
    out[0] = to_float(ptr[0]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* __restrict__ ptr, const float (&in)[VEC]) {
  if constexpr (VEC == Vec16<T>::kElems) {
    Pack16<T> p;
#pragma unroll
    for (int e = 0; e < VEC; ++e) p.elem[e] = from_float<T>(in[e]);
    *reinterpret_cast<uint4*>(ptr) = p.raw;
  } else {
    static_assert(VEC == 1, "VEC is 1 or a whole 128-bit vector");
    ptr[0] = from_float<T>(in[0]);
  }
}

// ---------------------------------------------------------------- reductions
// Full-warp sum: every lane of the warp must be active (callers keep
// whole warps alive until after the reduction).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the threads that share one row: a warp when blockDim.x == 32
// (several rows per block along y), the whole block when blockDim.x > 32
// (then blockDim.y == 1 and blockDim.x is a multiple of 32, at most 1024).
// `scratch` holds 32 floats of shared memory; it is free again on return.
__device__ __forceinline__ float row_group_sum(float v, float* scratch) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < num_warps ? scratch[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();  // scratch may be reused by the next reduction
  return t;
}

__host__ __device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace cuda
}  // namespace bertfast
