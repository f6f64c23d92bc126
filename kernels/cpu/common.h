// Shared helpers of the CPU kernels: storage dtypes (fp32, fp16, bf16) with fp32
// math, vectorisable exp / GELU, OpenMP helpers. Internal to kernels/cpu/ (it turns
// trapping math off for the file that includes it): the kernels' entry points are
// declared in kernels/cpu/kernels.h, which is what the bindings include.
//
// Everything here is written as plain scalar C++ that GCC/Clang vectorise at -O3
// with AVX2/FMA (no intrinsics, no std::erf/std::exp calls in hot loops: those do
// not vectorise without -ffast-math). Reductions use `#pragma omp simd reduction`.
#pragma once

// GCC (its default -ftrapping-math) will not if-convert the float compares of the
// clamps and selects below, which keeps exp / erf loops from vectorising ("control
// flow in loop"). The kernels never rely on floating-point exceptions, so trapping
// math is turned off for the kernel translation units that include this header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "constants.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#ifdef BERTFAST_WITH_OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__)
#define BF_INLINE inline __attribute__((always_inline))
#define BF_RESTRICT __restrict__
#else
#define BF_INLINE inline
#define BF_RESTRICT
#endif

// Runtime-dispatched clones (GCC ifunc, resolved when _C loads, from the CPU it runs
// on; nothing is probed at build or install time): the compiler's vectorised loops
// get an AVX-512 version next to the AVX2/FMA baseline the module is built for.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define BF_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define BF_CLONES
#endif

#ifdef BERTFAST_WITH_OPENMP
#define BF_PRAGMA(x) _Pragma(#x)
#define BF_SIMD_REDUCE_ADD(v) BF_PRAGMA(omp simd reduction(+ : v))
#define BF_SIMD_REDUCE_MAX(v) BF_PRAGMA(omp simd reduction(max : v))
#else
#define BF_SIMD_REDUCE_ADD(v)
#define BF_SIMD_REDUCE_MAX(v)
#endif

namespace bertfast {
namespace cpu {

// ------------------------------------------------------------------ dtypes
// Storage dtype codes (DType) and activation codes (Activation) come from
// kernels/constants.h, shared with the CUDA kernels and exported to Python.

struct bf16 {
  uint16_t bits;
};
// IEEE half stored as bits; converted with integer ops (GCC 12 does not vectorise
// _Float16 conversions without AVX512-FP16).
struct f16 {
  uint16_t bits;
};

BF_INLINE float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
BF_INLINE uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

BF_INLINE float to_f32(float v) { return v; }
// bf16 given as its 16 bits (buffers typed uint16_t, as the bf16 GEMM's).
BF_INLINE float bf16_bits_to_f32(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }
BF_INLINE float to_f32(bf16 v) { return bf16_bits_to_f32(v.bits); }
BF_INLINE float to_f32(f16 v) {
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  // Exponent+mantissa moved into float position and rescaled by 2^(127-15):
  // exact for normal and subnormal halves.
  uint32_t r = f32_to_bits(bits_to_f32(em << 13) * 5.192296858534828e+33f);
  r = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : r;  // inf / NaN
  return bits_to_f32(r | sign);
}

template <typename T>
BF_INLINE T from_f32(float v);
template <>
BF_INLINE float from_f32<float>(float v) {
  return v;
}
template <>
BF_INLINE f16 from_f32<f16>(float v) {
  // Round to nearest even, overflow to inf, NaN stays NaN; branch-free.
  const uint32_t x = f32_to_bits(v);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // normal range: rebias the exponent and round the 13 dropped mantissa bits
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  // subnormal range (|v| < 2^-14): adding 0.5 lines the mantissa up (FPU rounds)
  const uint32_t sub = f32_to_bits(bits_to_f32(a) + 0.5f) - 0x3f000000u;
  const uint32_t big = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  uint32_t r = a < 0x38800000u ? sub : normal;
  r = a >= 0x47800000u ? big : r;
  f16 h;
  h.bits = static_cast<uint16_t>(r | sign);
  return h;
}
template <>
BF_INLINE bf16 from_f32<bf16>(float v) {
  // Round to nearest even; NaN stays a (quiet) NaN.
  const uint32_t u = f32_to_bits(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  bf16 r;
  r.bits = static_cast<uint16_t>(is_nan ? nan : rounded);
  return r;
}

// Calls f(std::integral_constant<int, ACT>) for an Activation code (constants.h),
// kNoActivation included only when kWithNone; any other code throws.
template <bool kWithNone = false, typename F>
void dispatch_activation(int activation, F&& f) {
  visit_activation<kWithNone>(activation, f, [&]() -> void {
    throw std::invalid_argument("bertfast cpu: unknown activation code " +
                                std::to_string(activation));
  });
}

// Runs `body` with `T` bound to the storage type named by `dtype`.
#define BF_DISPATCH_DTYPE(dtype, T, ...)                                    \
  switch (dtype) {                                                          \
    case ::bertfast::kFloat32: {                                            \
      using T = float;                                                      \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case ::bertfast::kFloat16: {                                            \
      using T = ::bertfast::cpu::f16;                                       \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case ::bertfast::kBFloat16: {                                           \
      using T = ::bertfast::cpu::bf16;                                      \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    default:                                                                \
      throw std::invalid_argument("bertfast cpu: unsupported dtype code " + \
                                  std::to_string(static_cast<int>(dtype))); \
  }

// ------------------------------------------------------------------ threads
// Threads worth using for `work` units when one thread should get >= `grain`.
inline int threads_for(int64_t work, int64_t grain, int requested) {
  if (requested < 1) requested = 1;
  int64_t useful = grain > 0 ? (work + grain - 1) / grain : work;
  if (useful < 1) useful = 1;
  return static_cast<int>(useful < requested ? useful : requested);
}

// Inside an OpenMP parallel region (an orphaned worksharing loop; serial outside one):
// body(t) for every t in [0, n), shared among the region's threads either guided
// (large chunks first, then smaller ones to whichever thread is free) or in equal
// static shares. The GEMMs' task loops take guided above one row block: on a VM whose
// vCPUs are at times slowed by the host's other guests, a static share left the faster
// thread waiting at the join. Whole forwards, 2 threads, Intel Xeon AMX VM, guided /
// static alternating in one process (medians; the best calls 0.96-1.07x): int8 MiniLM
// 4x128 / 8x128 1.02-1.07x; bf16 1x128 1.00-1.18x, 4x128 1.09-1.18x. A plain dynamic
// schedule cost 3-8 % in the best calls; one row block (few rows) keeps the static
// split its thread count was tuned on (benchmarks/results/cpu-intel-xeon-amx-2t/notes.md,
// the sessions of 2026-11-29).
template <typename F>
BF_INLINE void share_tasks(int64_t n, bool guided, F&& body) {
  if (guided) {
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(guided)
#endif
    for (int64_t t = 0; t < n; ++t) body(t);
  } else {
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < n; ++t) body(t);
  }
}

// ------------------------------------------------------------------ math
// min / max defined here (after the optimize pragma) rather than std::min/max,
// which may come from a header included before it and then not if-convert.
BF_INLINE float fmin_(float a, float b) { return a < b ? a : b; }
BF_INLINE float fmax_(float a, float b) { return a > b ? a : b; }

// fp32 vectors for kernels written with GCC vector extensions (no intrinsics; one
// source for AVX-512, AVX2 and any other target), aligned(4): unaligned loads are
// fine. Arithmetic, comparisons and ?: work lane by lane, a scalar operand in every
// lane.
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef float v16f __attribute__((vector_size(64), aligned(4)));

// The uint32 type as wide as F (a float or a vector of them), and a bit-for-bit
// reinterpretation between same-size types (templates, so a vector is only
// instantiated where a kernel uses it).
template <typename F>
struct UintOf {
  typedef uint32_t type __attribute__((vector_size(sizeof(F))));
};
template <>
struct UintOf<float> {
  typedef uint32_t type;
};
template <typename To, typename From>
BF_INLINE To bit_cast_(From f) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast_ between sizes");
  To t;
  std::memcpy(&t, &f, sizeof(t));
  return t;
}

// NaN-propagating clamp to [lo, hi]: a NaN x stays NaN (fmin_/fmax_ would pick a
// bound), so the exp below returns NaN for NaN as std::exp does. F: float or a vector.
template <typename F>
BF_INLINE F clamp_keep_nan(F x, float lo, float hi) {
  const F a = x < lo ? F{} + lo : x;
  return a > hi ? F{} + hi : a;
}

// e^x for x in [-87, 88] (no range handling: the callers bound x), on a float or
// lane by lane on a vector (the same operations, so the same result); NaN for NaN (n
// is read from the float's bits, not converted). Relative error ~1e-7.
template <typename F>
BF_INLINE F exp_in_range(F x) {
  // n = round(x / ln2) via the 1.5 * 2^23 trick (exact for |n| < 2^22): the sum's
  // low mantissa bits hold n + 2^22, read as an integer (no float -> int
  // conversion, which is undefined for NaN).
  const F big = x * 1.44269504088896341f + 12582912.0f;
  const F n = big - 12582912.0f;
  using U = typename UintOf<F>::type;
  const U ni = bit_cast_<U>(big) - f32_to_bits(12582912.0f);  // n mod 2^32
  // r = x - n ln2 in two steps (Cody-Waite), |r| <= ln2 / 2.
  F r = n * -0.693145751953125f + x;
  r = n * -1.428606765330187045e-06f + r;
  // e^r by its Taylor series to degree 7 (truncation < 6e-9 for |r| <= 0.347).
  F p = F{} + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const F scale = bit_cast_<F>((ni + 127u) << 23);  // 2^n
  return p * scale;                                 // NaN when x is NaN (p is)
}

// exp(x) for fp32, relative error ~1e-7, on a float or lane by lane on a vector.
// Returns exactly 0 below -87.3 (so exp(-inf) == 0), saturates near 2^127 above 88.3,
// and NaN for NaN (the clamp keeps it).
template <typename F>
BF_INLINE F fast_exp(F x) {
  const float lo = -87.3f, hi = 88.3f;
  const F e = exp_in_range(clamp_keep_nan(x, lo, hi));
  return x < lo ? F{} : e;
}

// GELU with the exact (erf) form: x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 =
// erfc(z) / 2 for x < 0 and 1 - erfc(z) / 2 for x >= 0, with z = |x| / sqrt 2 and
//   erfc(z) = exp(Q(z - 2.75) - z^2)   for z <= 5.5 (Q: degree 13, fit to log erfc + z^2)
//   erfc(z) = 0                          for z > 5.5 (below 1e-14)
// One branch-free formula for every x: the exponent (z^2 split into hi + lo, exact
// with FMA) keeps exp(-z^2) accurate, so tiny outputs (x << 0) keep their relative
// accuracy; Q is evaluated in Estrin's form (four levels of FMAs instead of a chain
// of thirteen). Q's coefficients are a weighted least-squares fit made for bertfast
// (fit error 4e-8; 5e-7 with fp32 rounding, the erfc's relative error).
BF_INLINE float gelu_erf(float x) {
  const float z = (x < 0.0f ? -x : x) * 0.70710678118654752f;
  const float zc = z < 5.5f ? z : 5.5f;  // Q's range (NaN: 5.5; x * phi stays NaN)
  const float u = zc - 2.75f, u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
  const float p0 = u * -3.265359700e-01f + -1.641640425e+00f;
  const float p1 = u * -8.933229372e-03f + 4.871340469e-02f;
  const float p2 = u * -3.206881229e-04f + 1.704685157e-03f;
  const float p3 = u * -9.571684132e-06f + 5.787208647e-05f;
  const float p4 = u * -1.588799279e-07f + 1.292085017e-06f;
  const float p5 = u * 2.541649113e-09f + 2.971788859e-08f;
  const float p6 = u * 6.417913978e-10f + -3.977631113e-09f;
  const float q0 = u2 * p1 + p0, q1 = u2 * p3 + p2, q2 = u2 * p5 + p4;
  const float q = u8 * (u4 * p6 + q2) + (u4 * q1 + q0);
  const float s = zc * zc;
  const float s_lo = std::fma(zc, zc, -s);
  float erfc_z = exp_in_range((q - s) - s_lo);  // exponent in [-33, 0]
  erfc_z = z > 5.5f ? 0.0f : erfc_z;
  const float h = 0.5f * erfc_z;
  return x * (x < 0.0f ? h : 1.0f - h);
}

// GELU (erf) for a result that is rounded to bf16 next, where gelu_erf's accuracy is
// spent for nothing: relative error <= 1.6e-5 (bf16 keeps 2^-9 = 2e-3), so the rounded
// value differs from the correctly rounded one in about 0.04% of inputs, by one unit
// (tests/ops/test_cpu_blinear.py and test_cpu_backend.py check it against float64).
// About 30 operations a vector instead of gelu_erf's 45: with h = erfc(z) / 2,
// z = |x| / sqrt 2 and s = z / 5.5 (z in [0, 5.5] -> s in [0, 1]),
//   t = log2 h = Q(s)        (Q: degree 8, z^2 inside it; fit error 6e-6, Q(0) = -1)
//   h = 2^t = 2^n * 2^f      (n = round(t), f in [-1/2, 1/2], 2^f to degree 5: 3e-6)
//   h = 0 for z > 5.5        (h < 4e-15, as gelu_erf)
// and x h for x < 0, x (1 - h) otherwise. Q(0) is exactly -1, so h is exactly 1/2
// near 0 and x / 2 rounds as torch's does (ties of subnormal x included); tiny outputs
// (x << 0) keep their relative accuracy; +inf stays +inf, NaN stays NaN, -inf gives
// NaN (as torch and gelu_erf). Q is a weighted least-squares (near minimax) fit made
// for bertfast (tools/fit_gelu_bf16.py prints it).
BF_INLINE float gelu_erf_bf16(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float s = ax * 0.12856486930664502f;  // 1 / (5.5 sqrt 2)
  const float w = s < 1.0f ? s : 1.0f;        // Q's range (NaN: 1; x * (1 - h) stays NaN)
  const float w2 = w * w, w4 = w2 * w2, w8 = w4 * w4;
  const float p0 = w * -8.954719543e+00f + -1.0f;
  const float p1 = w * -2.551473808e+01f + -2.772849464e+01f;
  const float p2 = w * -2.865777016e+01f + 3.186372757e+01f;
  const float p3 = w * -5.971199512e+00f + 1.710135269e+01f;
  const float t = w8 * 9.121971726e-01f + ((w2 * p1 + p0) + w4 * (w2 * p3 + p2));  // [-48, -1]
  // n = round(t) by the 1.5 * 2^23 trick (see exp_in_range); 2^n is a normal float.
  const float big = t + 12582912.0f;
  const float n = big - 12582912.0f;
  const float f = t - n;
  float p = 1.3333558146428443e-3f;  // ln2^k / k!, k = 5 .. 0
  p = p * f + 9.618129107628477e-3f;
  p = p * f + 5.550410866482158e-2f;
  p = p * f + 0.2402265069591007f;
  p = p * f + 0.6931471805599453f;
  p = p * f + 1.0f;
  const uint32_t ni = bit_cast_<uint32_t>(big) - f32_to_bits(12582912.0f);
  const float h = s > 1.0f ? 0.0f : p * bit_cast_<float>((ni + 127u) << 23);
  return x * (x < 0.0f ? h : 1.0f - h);
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)),
// u = sqrt(2/pi) (x + 0.044715 x^3).
// Far below zero (exp overflows) the result is 0 * x: -0 as in torch, NaN for -inf.
BF_INLINE float gelu_tanh(float x) {
  float t = -1.5957691216057308f * (x + 0.044715f * x * x * x);  // -2u
  float y = x / (1.0f + fast_exp(t));
  return t > 88.0f ? 0.0f * x : y;
}

// NaN propagates (as in torch), -0 stays -0.
BF_INLINE float relu(float x) { return x < 0.0f ? 0.0f : x; }

// act(y) for an activation code of constants.h (kGeluErf, kGeluTanh, kRelu; any other
// code: y unchanged).
template <int ACT>
BF_INLINE float activate(float y) {
  return ACT == kGeluErf    ? gelu_erf(y)
         : ACT == kGeluTanh ? gelu_tanh(y)
         : ACT == kRelu     ? relu(y)
                            : y;
}

// act(y) for a value stored as T next (float, f16 or bf16): the erf GELU of a bf16
// result is gelu_erf_bf16, every other pair activate<ACT>.
template <int ACT, typename T>
BF_INLINE float activate_for(float y) {
  return (ACT == kGeluErf && std::is_same<T, bf16>::value) ? gelu_erf_bf16(y) : activate<ACT>(y);
}

// x[j] = act(x[j]) for j < n, in place, as one out-of-line unit-stride loop that
// vectorises (bias_act.cpp): what the GEMM epilogues call on their fp32 sums, where
// the activation inlined into the tile loop's function would be compiled short of
// registers (its polynomial constants spilled to the stack). T: the type the values
// are stored as next (activate_for); float and bf16 are instantiated.
template <typename T>
void activate_inplace(int act, float* x, int64_t n);

// ------------------------------------------------------------------ large outputs
// A fresh output tensor above glibc's mmap threshold is new mmap memory at every
// call, and faulting it in 4 KiB pages inside a GEMM costs as much as the GEMM
// (gemm.cpp: 8192 x 1152 fp32, 30 ms per call instead of 16; qgemm.cpp: 4096 x 1152,
// ~2 ms). Ask for transparent huge pages on the whole 2 MiB pages inside it (advice
// only: no effect where THP is off, or on pages already present).
inline void advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  if (bytes < static_cast<int64_t>(4 * kHuge)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace cpu
}  // namespace bertfast
