// Host-side launchers of the CUDA kernels in kernels/cuda/*.cu, declared for
// csrc/cuda/cuda_ops.cpp (plain C++: this header uses no CUDA language features).
//
// Every launcher enqueues its kernel(s) on `stream`, on the current device (the
// caller sets it), and returns cudaGetLastError() after the launch, or
// cudaErrorInvalidValue for a configuration it does not support (the binding has
// checked every tensor's device, dtype, contiguity and sizes against the sizes
// passed here, and the limits of kernels/constants.h). Pointers are device pointers;
// optional ones may be null. All tensors are contiguous.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "constants.h"

namespace bertfast {
namespace cuda {

// dtype / activation codes and size limits: kernels/constants.h.

// out[r] = LN(word[ids[r]] + type[type_ids[r]] + pos[pos_ids[r]]) * weight + bias.
// ids are int64; a row whose id is out of range is written as NaN.
cudaError_t launch_embed_layernorm(void* out, const int64_t* input_ids, const int64_t* position_ids,
                                   const int64_t* token_type_ids, const void* word, const void* pos,
                                   const void* types, const void* weight, const void* bias,
                                   int64_t rows, int64_t width, int64_t vocab,
                                   int64_t max_positions, int64_t type_vocab, float eps, int dtype,
                                   cudaStream_t stream);

// out[r] = LN((x[r] + bias) + residual[r]) * weight + ln_bias (bias optional).
cudaError_t launch_add_layernorm(void* out, const void* x, const void* residual, const void* bias,
                                 const void* weight, const void* ln_bias, int64_t rows,
                                 int64_t width, float eps, int dtype, cudaStream_t stream);

// out = act(x + bias) over [rows, width] (bias optional, out may equal x).
cudaError_t launch_bias_act(void* out, const void* x, const void* bias, int64_t rows, int64_t width,
                            int activation, int dtype, cudaStream_t stream);

// Padded: qkv [batch, seqlen, 3H], mask [batch, seqlen] bytes (nonzero = real
// token, may be null) -> out [batch, seqlen, H].
// Varlen (cu_seqlens != null): qkv [total_tokens, 3H], cu_seqlens int32 [batch+1],
// seqlen = max_seqlen -> out [total_tokens, H].
cudaError_t launch_attention(void* out, const void* qkv, const uint8_t* mask,
                             const int32_t* cu_seqlens, int64_t batch, int64_t seqlen,
                             int64_t total_tokens, int num_heads, int head_dim, float scale,
                             int dtype, cudaStream_t stream);

// FlashAttention-2-style attention (flash_attention.cu): the contract and layouts
// of launch_attention, fp16 / bf16 only (dtype float32 -> cudaErrorInvalidValue),
// head dims of CudaFlashAttentionHeadDims, sm_80+. qkv and out 16-byte aligned and
// H * 2 bytes a multiple of 16 (cudaErrorMisalignedAddress otherwise). Varlen
// needs `scratch`: flash_attention_scratch_ints(batch, total_tokens) int32 of
// device memory, used by the kernels on `stream` (null for padded).
int64_t flash_attention_scratch_ints(int64_t batch, int64_t total_tokens);
cudaError_t launch_flash_attention(void* out, const void* qkv, const uint8_t* mask,
                                   const int32_t* cu_seqlens, int32_t* scratch, int64_t batch,
                                   int64_t seqlen, int64_t total_tokens, int num_heads,
                                   int head_dim, float scale, int dtype, cudaStream_t stream);

// out[t] = x[indices[t]] for t < num_indices; rows are row_bytes bytes; an
// index outside [0, num_src_rows) gives a zero row.
cudaError_t launch_pack_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
                             int64_t num_src_rows, int64_t row_bytes, cudaStream_t stream);

// out = zeros[num_out_rows]; out[indices[t]] = x[t]; an index outside
// [0, num_out_rows) is skipped.
cudaError_t launch_unpack_rows(void* out, const void* x, const int64_t* indices,
                               int64_t num_indices, int64_t num_out_rows, int64_t row_bytes,
                               cudaStream_t stream);

}  // namespace cuda
}  // namespace bertfast
