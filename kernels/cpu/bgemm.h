// bf16 GEMM of the CPU backend for few rows (kernels/cpu/bgemm.cpp), bound in
// csrc/cpu_bf16_ops.cpp:
//   out[m, n] = bf16(act(sum_k x[m, k] * w[n, k] + bias[n]))
// x, w, bias and out in bf16; every product and sum in fp32, bias and activation in
// fp32, one rounding to bf16 at the end (nearest even; NaN stays NaN). On AMX
// (tdpbf16ps) the tiles treat bf16 subnormal inputs as zero, as oneDNN's AMX GEMMs do.
//
// Weights: bf16 [N, K] packed once into panels of kBPanel columns,
// [P][Kp / 2][kBPanel][2] (Kp = K rounded up to 32, zero padded): each k pair of a
// column sits in one 32-bit word, the layout AMX's B tiles read. It is also the layout
// oneDNN gives a bf16 inner-product weight on AMX machines (checked per weight before
// its buffer is read as panels: bertfast/ops/cpu/weights.py).
#pragma once

#include <cstdint>

namespace bertfast {
namespace cpu {

constexpr int64_t kBPanel = 32;

// Micro-kernels: kBIsaAmx (AMX-BF16 tiles) or kBIsaPortable (fp32 FMAs on every CPU).
enum BIsa : int { kBIsaPortable = 1, kBIsaAmx = 3 };

bool bgemm_cpu_has_amx();  // AMX-BF16 and the OS granted this process the tile state

// K rounded up to a whole AMX tile row (32 bf16).
inline int64_t bgemm_padded_k(int64_t K) { return (K + 31) / 32 * 32; }

// packed: [ceil(N / kBPanel)][Kp / 2][kBPanel][2] bf16 bits from w [N, K].
void bgemm_pack(uint16_t* packed, const uint16_t* w, int64_t N, int64_t K, int num_threads);

// out [M, N] from x [M, K] and packed; bias [N] may be null; activation
// kNoActivation / kGeluErf / kGeluTanh / kRelu; isa resolved by the caller.
void blinear(uint16_t* out, const uint16_t* x, const uint16_t* packed, const uint16_t* bias,
             int64_t M, int64_t N, int64_t K, int activation, int isa, int num_threads);

}  // namespace cpu
}  // namespace bertfast
