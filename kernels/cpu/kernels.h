// Entry points of the C++ (CPU) kernels in kernels/cpu/, declared for the bindings
// (csrc/cpu_ops.cpp) and for the kernel files that define them: the CPU side's
// counterpart of kernels/cuda/launchers.cuh. Plain declarations (no helpers, no
// pragmas); what the kernels share internally is kernels/cpu/common.h. The int8 GEMM
// has an API header of its own, kernels/cpu/qgemm.h (bound in csrc/cpu_int8_ops.cpp).
//
// The binding has checked every tensor's device, dtype, contiguity and sizes against
// the sizes passed here. All pointers are raw, contiguous, row-major host memory;
// `dtype` is a DType code and `activation` an Activation code (kernels/constants.h);
// `num_threads` is torch.get_num_threads() of the caller. Errors are thrown:
// std::invalid_argument (unknown dtype or activation code, hidden not divisible by
// num_heads) or std::out_of_range (pack indices, cu_seqlens); ids and indices are
// followed only inside their tables, whatever the caller checked.
#pragma once

#include <cstdint>

#include "constants.h"

namespace bertfast {
namespace cpu {

// ------------------------------------------------------------------ layernorm.cpp
// out[t] = LN(word[input_ids[t]] + types[token_type_ids[t]] + pos[position_ids[t]])
// * weight + bias over [tokens, width]; types (and token_type_ids) may be null. A
// token whose id is outside its table is written as NaN.
void embed_layernorm(int dtype, void* out, const int64_t* input_ids, const int64_t* position_ids,
                     const int64_t* token_type_ids, const void* word, int64_t vocab,
                     const void* pos, int64_t num_pos, const void* types, int64_t num_types,
                     const void* weight, const void* bias, int64_t tokens, int64_t width, float eps,
                     int num_threads);
// out[r] = LN((x[r] + bias) + residual[r]) * weight + ln_bias over [rows, hidden]
// (bias may be null).
void add_layernorm(int dtype, void* out, const void* x, const void* residual, const void* bias,
                   const void* weight, const void* ln_bias, int64_t rows, int64_t hidden, float eps,
                   int num_threads);

// ------------------------------------------------------------------ convert.cpp
// out[j] = x[j] in dst_dtype for j < n (src_dtype, dst_dtype: DType codes; rounded
// once, to nearest even; NaN stays NaN).
void convert(int src_dtype, int dst_dtype, void* out, const void* x, int64_t n, int num_threads);

// ------------------------------------------------------------------ bias_act.cpp
// out = act(x + bias) over [rows, cols] (bias may be null; out may equal x).
void bias_act(int dtype, void* out, const void* x, const void* bias, int64_t rows, int64_t cols,
              int activation, int num_threads);

// ------------------------------------------------------------------ attention*.cpp
// Multi-head self-attention on the fused QKV tensor, heads merged on output
// (attention.cpp; micro-kernels in attention_fp32.cpp and attention_bf16.cpp).
// Padded: qkv [batch, seqlen, 3 * hidden], mask [batch, seqlen] bytes (nonzero = real
// token, may be null) -> out [batch, seqlen, hidden]; padded query rows, and every
// row of a sequence with no real key, are written as zeros.
void attention_padded(int dtype, void* out, const void* qkv, const uint8_t* mask, int64_t batch,
                      int64_t seqlen, int64_t num_heads, int64_t hidden, float scale,
                      int num_threads);
// Varlen: qkv [tokens, 3 * hidden], cu_seqlens int32 [batch + 1] rising from 0 to
// tokens (checked here: std::out_of_range otherwise) -> out [tokens, hidden].
void attention_varlen(int dtype, void* out, const void* qkv, const int32_t* cu_seqlens,
                      int64_t batch, int64_t tokens, int64_t num_heads, int64_t hidden, float scale,
                      int num_threads);

// Whether this process may use AMX bf16 tiles: the CPU has them and (Linux only; no
// AMX elsewhere) the kernel grants the tile state to the process (attention_bf16.cpp;
// also the bf16 GEMM's, bgemm.cpp).
bool amx_bf16_available();

// ------------------------------------------------------------------ gemm.cpp
// fp32: out[M, N] = act(x[M, K] @ weight[N, K]^T + bias); activation
// kNoActivation = none. linear_pack packs [ceil(N / NR), K, NR] floats, NR =
// linear_panel_width; linear_packed reads panels of any multiple of NR (panel_width:
// also oneDNN's 64-wide fp32 weight blocks, bertfast/ops/cpu/weights.py).
int linear_panel_width(bool allow_avx512);
void linear_pack(void* packed, const void* weight, int64_t N, int64_t K, bool allow_avx512,
                 int num_threads);
void linear_packed(void* out, const void* x, const void* packed, const void* bias, int64_t M,
                   int64_t N, int64_t K, int64_t panel_width, int activation, bool allow_avx512,
                   int num_threads);
void linear_act(void* out, const void* x, const void* weight, const void* bias, int64_t M,
                int64_t N, int64_t K, int activation, bool allow_avx512, int num_threads);

// ------------------------------------------------------------------ pack.cpp
// Rows are opaque byte strings of row_bytes (any dtype). Indices are checked first
// (std::out_of_range), so nothing out of bounds is read or written.
// pack_rows:   out[i] = x[indices[i]] for i < num_indices; x has src_rows rows.
void pack_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
               int64_t src_rows, int64_t row_bytes, int num_threads);
// unpack_rows: out [num_rows] = zeros, then out[indices[i]] = x[i] (last writer wins).
void unpack_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
                 int64_t num_rows, int64_t row_bytes, int num_threads);
// scan_inputs: stats [kScanStats] = ids min, max; token types min, max (0, 0 without
// them); positions min, max (0, 0 without them); real tokens, longest row; and
// cu_seqlens [batch + 1] of each row's nonzero mask entries (mask_kind: kScanMask*;
// kScanMaskNone: every position real). Inputs [batch, seqlen], row-major.
// scan_indices: the flat positions (b * seqlen + s) of the first `total` real tokens.
constexpr int kScanStats = 8;
constexpr int kScanMaskNone = 0, kScanMaskInt64 = 1, kScanMaskInt32 = 2, kScanMaskBool = 3;
void scan_inputs(int64_t* stats, int32_t* cu_seqlens, const int64_t* input_ids, const void* mask,
                 int mask_kind, const int64_t* token_type_ids, const int64_t* position_ids,
                 int64_t batch, int64_t seqlen);
void scan_indices(int64_t* indices, int64_t total, const void* mask, int mask_kind, int64_t count);

// ------------------------------------------------------------------ pool.cpp
// One fp32 vector per sequence of packed rows h [T, hidden] (cu_seqlens [batch + 1],
// every sequence at least one row): mode kPoolCls / kPoolMean / kPoolMeanSqrtLen /
// kPoolLastToken, then L2-normalised when `normalize`. out: [batch, hidden].
enum PoolMode { kPoolCls = 0, kPoolMean = 1, kPoolMeanSqrtLen = 2, kPoolLastToken = 3 };
void pool_packed(float* out, const float* h, const int32_t* cu_seqlens, int64_t batch,
                 int64_t hidden, int mode, bool normalize);

}  // namespace cpu
}  // namespace bertfast
