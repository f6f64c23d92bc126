// int8 GEMM of the CPU backend (kernels/cpu/qgemm.cpp), bound in csrc/cpu_int8_ops.cpp.
//
// Activations: fp32 rows quantized per row (per token) at run time to uint8 with a
// scale and a zero point (asymmetric, zero exactly representable):
//   lo = min(0, min_k x), hi = max(0, max_k x), scale = max(hi/255 - lo/255, 2^-100),
//   inv = 1/scale, zp = clamp(round(-lo*inv), 0, 255),
//   q = clamp(round(x*inv), -zp, 255 - zp) + zp           (round: half to even, fp32)
// A row holding NaN or +-inf gets scale = NaN (zp = 0, q = 0): its outputs are NaN.
// Weights: int8 [N, K] (symmetric per-output-channel scales, quantized in Python),
// packed once into panels of kQPanel columns, [P][Kp/4][kQPanel][4] (Kp = K rounded
// up to 4, zero padded), with the column sums sum_k w[n, k] for the zero-point term.
//   acc[m, n] = sum_k q[m, k] * w[n, k]                      (int32, exact)
//   out[m, n] = act(float(acc - zp[m] * colsum[n]) * (scale[m] * w_scale[n]) + bias[n])
// K <= kQMaxK keeps every int32 sum exact (255 * 127 * 65536 < 2^31).
#pragma once

#include <cstdint>

namespace bertfast {
namespace cpu {

constexpr int64_t kQPanel = 64;
constexpr int64_t kQMaxK = 65536;

// Instruction sets of the int8 micro-kernel.
// kQIsaAmx runs AMX tiles (tdpbusd) where K % 64 == 0 and VNNI otherwise.
enum QIsa : int { kQIsaAuto = 0, kQIsaAvx2 = 1, kQIsaVnni = 2, kQIsaAmx = 3 };

bool qgemm_cpu_has_vnni();              // AVX512-VNNI (+ F/BW/VL) on this CPU
bool qgemm_cpu_has_amx();               // AMX-INT8 and the OS granted this process the tile state
int qgemm_isa_for(int isa, int64_t K);  // the micro-kernel a call with K runs
bool qgemm_cpu_has_avx2();

// Row stride of the quantized activations the GEMM reads: K rounded up to 4.
inline int64_t qgemm_padded_k(int64_t K) { return (K + 3) / 4 * 4; }

// q: [M, ldq] (ldq >= K; bytes [K, ldq) of each row are set to 0), scale [M], zp [M].
void quantize_rows(uint8_t* q, float* scale, int32_t* zp, const float* x, int64_t M, int64_t K,
                   int64_t ldq, int num_threads);

// packed: [ceil(N / kQPanel)][Kp / 4][kQPanel][4] int8; colsum: [ceil(N / kQPanel) * kQPanel].
void qgemm_pack(int8_t* packed, int32_t* colsum, const int8_t* w, int64_t N, int64_t K,
                int num_threads);

// Raw accumulators out[M, N] = sum_k a[m, k] * w[n, k] (a: [M, lda], lda = padded K,
// padding bytes zero). isa: kQIsaAvx2 or kQIsaVnni (resolved by the caller).
void qgemm_s32(int32_t* out, const uint8_t* a, int64_t lda, const int8_t* packed, int64_t M,
               int64_t N, int64_t K, int isa, int num_threads);

// Fused: quantize x [M, K] per row, multiply, fp32 epilogue (bias may be null,
// activation kNoActivation / kGeluErf / kGeluTanh / kRelu).
// split: x in two parts, its uint8 rows (q1, scale1, zp1) and what they miss,
//   r = x - (q1 - zp1) * scale1 (fp32), itself quantized per row (q2, scale2, zp2);
//   out = act(y1 + y2) with y1 = the epilogue of q1 without bias, y2 = that of q2
//   with bias: ~16-bit activations for two int8 GEMMs.
void qlinear(float* out, const float* x, const int8_t* packed, const int32_t* colsum,
             const float* w_scale, const float* bias, int64_t M, int64_t N, int64_t K,
             int activation, int isa, int num_threads, bool split = false);

}  // namespace cpu
}  // namespace bertfast
