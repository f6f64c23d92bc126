// Facts shared by the C++ (CPU) kernels, the CUDA kernels and the Python side,
// stated once. Plain C++17 (no ATen, no CUDA, no project include): the base of the
// native tree, below kernels/cpu, kernels/cuda and the bindings (csrc/), which all
// include it; nothing here includes them (tests/test_layering_native.py).
// bertfast._C.constants() exports it to Python (bertfast/ops/native.py reads it
// there); native.HEADER_CONSTANTS in that module restates it for the Triton backend,
// which must work without a native build, and tests/ops/test_native_constants.py
// checks that mirror against this header and against the build.
#pragma once

#include <cstdint>
#include <type_traits>

namespace bertfast {

// Storage dtypes of the floating-point kernels (math is fp32 for all three).
// The bindings map torch dtypes to these codes; names are torch's.
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
inline constexpr const char* kDTypeNames[] = {"float32", "float16", "bfloat16"};

// Activation epilogues; code = index into kActivationNames (the Triton kernels use
// the same codes as their ACTIVATION constexpr). kNoActivation: plain linear.
enum Activation : int { kNoActivation = -1, kGeluErf = 0, kGeluTanh = 1, kRelu = 2 };
inline constexpr const char* kActivationNames[] = {"gelu", "gelu_tanh", "relu"};

// Returns f(std::integral_constant<int, ACT>) for the Activation code `activation`
// (kNoActivation only when kWithNone), or unknown() for any other code: the one
// runtime-code-to-template switch of the CPU and CUDA kernels.
template <bool kWithNone, typename F, typename Unknown>
auto visit_activation(int activation, F&& f, Unknown&& unknown) {
  switch (activation) {
    case kGeluErf:
      return f(std::integral_constant<int, kGeluErf>{});
    case kGeluTanh:
      return f(std::integral_constant<int, kGeluTanh>{});
    case kRelu:
      return f(std::integral_constant<int, kRelu>{});
    case kNoActivation:
      if constexpr (kWithNone) return f(std::integral_constant<int, kNoActivation>{});
      break;
    default:
      break;
  }
  return unknown();
}

// Head dims the CUDA attention kernel is compiled for (kernels/cuda/attention.cu
// instantiates exactly this list).
template <int... D>
struct IntList {
  static constexpr int kSize = sizeof...(D);
  static constexpr int kValues[sizeof...(D)] = {D...};
};
using CudaAttentionHeadDims = IntList<32, 64, 80, 96, 128>;
// Head dims of the FlashAttention-2-style kernel (kernels/cuda/flash_attention.cu,
// fp16 / bf16 only; the cuda backend's "flash" attention variant).
using CudaFlashAttentionHeadDims = IntList<32, 64, 80, 96, 128>;

// Widest LayerNorm row the CUDA kernels hold in registers (512 threads x 32
// floats); the Triton LayerNorm has the same limit.
constexpr int64_t kMaxLayerNormWidth = 16384;
// CUDA grid y / z limit: attention puts heads on y and sequences on z.
constexpr int64_t kMaxGridYZ = 65535;
// Longest sequence the CUDA attention kernel indexes with 32-bit query offsets.
constexpr int64_t kMaxCudaSeqLen = int64_t(1) << 30;
// Rows / tokens the CUDA LayerNorm grid can cover (grid x limit, 2^31 - 1).
constexpr int64_t kMaxCudaRows = 0x7fffffffLL;

}  // namespace bertfast
