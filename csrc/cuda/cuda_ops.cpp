// bertfast._C.cuda: the CUDA kernels in kernels/cuda/ (compiled only when nvcc is
// found) as torch operators (torch.ops.bertfast_cuda.*, registered through the stable
// ABI: csrc/binding.h; its module init puts each on bertfast._C.cuda: bertfast/_operators.py), plus
// the tensor-free device_count / error_name (csrc/registry.h) that csrc/module.cpp binds.
//
// Same entry points and argument order as bertfast._C.cpu (csrc/cpu_ops.cpp), with
// a trailing `stream`: the cudaStream_t of torch's current stream on the tensors'
// device (torch.cuda.current_stream(device).cuda_stream), passed from Python so
// that this file needs no torch CUDA header (torch's CUDA headers and libraries
// are not needed to build it). Each entry point checks its tensors
// (csrc/binding.h, plus the CUDA kernels' limits from kernels/constants.h),
// allocates its output through torch's allocator, makes the tensors' device
// current for the call, enqueues on `stream` (torch releases the GIL around an
// operator call) and turns a launch error into RuntimeError naming the op.
#include <torch/csrc/stable/library.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "binding.h"
#include "cuda/launchers.cuh"
#include "registry.h"

namespace bertfast {

namespace {

using namespace binding;

[[noreturn]] void raise_cuda_error(const char* op, const char* what, cudaError_t err) {
  throw std::runtime_error(std::string("bertfast._C.cuda.") + op + ": " + what +
                           " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) raise_cuda_error(op, what, err);
}

// Makes `device` current for its lifetime and restores the previous device.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* op) {
    check(cudaGetDevice(&previous_), op, "cudaGetDevice");
    if (device != previous_) {
      check(cudaSetDevice(device), op, "cudaSetDevice");
      restore_ = true;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

Op cuda_op(const char* name) { return Op("cuda", name, DeviceType::CUDA); }

// The schema's `int stream`: the cudaStream_t handle's bits as int64.
cudaStream_t stream_of(int64_t s) {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s));
}

// Enqueues `launch` (returning cudaError_t) on `t`'s device.
template <typename F>
void run(const Op& op, const Tensor& t, F&& launch) {
  DeviceGuard guard(t.get_device(), op.name());
  check(launch(), op.name(), "kernel launch");
}

void check_rows_limit(const Op& op, int64_t rows, int64_t width) {
  if (width > kMaxLayerNormWidth)
    op.value_error("row width " + std::to_string(width) + " > " +
                   std::to_string(kMaxLayerNormWidth) +
                   " (the CUDA kernel holds a row in registers)");
  if (rows > kMaxCudaRows) op.value_error(std::to_string(rows) + " rows > 2^31 - 1");
}

Tensor embed_layernorm(const Tensor& input_ids, const Tensor& position_ids,
                       const OptTensor& token_type_ids, const Tensor& word, const Tensor& pos,
                       const OptTensor& types, const Tensor& weight, const Tensor& bias, double eps,
                       int64_t stream) {
  Op op = cuda_op("embed_layernorm");
  const EmbedArgs a = check_embed_layernorm(op, input_ids, position_ids, token_type_ids, word, pos,
                                            types, weight, bias, eps);
  check_rows_limit(op, a.tokens, a.width);
  Tensor out = empty(embed_out_shape(input_ids, a.width), word);
  if (a.tokens == 0 || a.width == 0) return out;
  // Ids outside their table give a NaN row (the kernel never reads out of bounds).
  run(op, out, [&] {
    return cuda::launch_embed_layernorm(
        out.data_ptr(), input_ids.const_data_ptr<int64_t>(), position_ids.const_data_ptr<int64_t>(),
        types ? token_type_ids->const_data_ptr<int64_t>() : nullptr, word.const_data_ptr(),
        pos.const_data_ptr(), types ? types->const_data_ptr() : nullptr, weight.const_data_ptr(),
        bias.const_data_ptr(), a.tokens, a.width, a.vocab, a.num_pos, a.num_types,
        static_cast<float>(eps), a.dtype, stream_of(stream));
  });
  return out;
}

Tensor add_layernorm(const Tensor& x, const Tensor& residual, const OptTensor& bias,
                     const Tensor& weight, const Tensor& ln_bias, double eps, int64_t stream) {
  Op op = cuda_op("add_layernorm");
  const RowsArgs a = check_add_layernorm(op, x, residual, bias, weight, ln_bias, eps);
  check_rows_limit(op, a.rows, a.width);
  Tensor out = empty(shape_of(x), x);
  if (a.rows == 0 || a.width == 0) return out;
  run(op, out, [&] {
    return cuda::launch_add_layernorm(out.data_ptr(), x.const_data_ptr(), residual.const_data_ptr(),
                                      bias ? bias->const_data_ptr() : nullptr,
                                      weight.const_data_ptr(), ln_bias.const_data_ptr(), a.rows,
                                      a.width, static_cast<float>(eps), a.dtype, stream_of(stream));
  });
  return out;
}

Tensor bias_act(const Tensor& x, const OptTensor& bias, const std::string& activation, bool inplace,
                int64_t stream) {
  Op op = cuda_op("bias_act");
  const BiasActArgs a = check_bias_act(op, x, bias, activation);
  Tensor out = inplace ? x : empty(shape_of(x), x);
  if (a.rows == 0 || a.width == 0) return out;
  run(op, out, [&] {
    return cuda::launch_bias_act(out.data_ptr(), x.const_data_ptr(),
                                 bias ? bias->const_data_ptr() : nullptr, a.rows, a.width,
                                 a.activation, a.dtype, stream_of(stream));
  });
  return out;
}

// The two CUDA attention kernels: attention.cu (every dtype) and the
// FlashAttention-2-style flash_attention.cu (fp16 / bf16, sm_80+).
enum class AttentionKernel { kDefault, kFlash };

template <int... D>
bool head_dim_in(IntList<D...>, int64_t head_dim) {
  return ((head_dim == D) || ...);
}

template <int... D>
std::string head_dim_list(IntList<D...>) {
  std::string dims;
  ((dims += (dims.empty() ? "" : ", ") + std::to_string(D)), ...);
  return dims;
}

// A kernel's own limits, on top of check_attention*: one place for both kernels.
void check_attention_limits(const Op& op, const Tensor& qkv, const AttentionArgs& a,
                            AttentionKernel kernel) {
  const bool flash = kernel == AttentionKernel::kFlash;
  if (flash && a.dtype == kFloat32)
    op.type_error(
        "qkv is float32; the flash kernel takes float16 or bfloat16 (fp32 runs the "
        "default attention kernel)");
  const bool head_dim_ok = flash ? head_dim_in(CudaFlashAttentionHeadDims{}, a.head_dim)
                                 : head_dim_in(CudaAttentionHeadDims{}, a.head_dim);
  if (!head_dim_ok)
    op.value_error("head_dim " + std::to_string(a.head_dim) + " is not one of the compiled " +
                   "head dims " +
                   (flash ? head_dim_list(CudaFlashAttentionHeadDims{})
                          : head_dim_list(CudaAttentionHeadDims{})));
  if (a.num_heads > kMaxGridYZ)
    op.value_error("num_heads " + std::to_string(a.num_heads) + " > " + std::to_string(kMaxGridYZ));
  if (a.batch > kMaxGridYZ)
    op.value_error("batch " + std::to_string(a.batch) + " > " + std::to_string(kMaxGridYZ) +
                   " sequences");
  if (a.seqlen > kMaxCudaSeqLen)
    op.value_error("sequence length " + std::to_string(a.seqlen) + " > 2^30");
  if (reinterpret_cast<std::uintptr_t>(qkv.const_data_ptr()) % 16)
    op.value_error("qkv's data must be 16-byte aligned (pass a fresh copy)");
  if (flash) {
    // 16-byte cp.async copies of every row (and 16-byte stores of out's rows).
    if ((a.hidden * qkv.element_size()) % 16)
      op.value_error("hidden size " + std::to_string(a.hidden) + " x " +
                     std::to_string(qkv.element_size()) +
                     " bytes is not a multiple of 16 (the flash kernel copies rows in "
                     "16-byte pieces)");
    // The grid's x: query tiles of 128 rows, at most T / 128 + batch (padded: B x
    // ceil(S / 128) <= B x S = T), below the grid limit.
    if (a.tokens > kMaxCudaRows) op.value_error(std::to_string(a.tokens) + " rows > 2^31 - 1");
  }
  if (flash || qkv.scalar_type() == ScalarType::BFloat16) {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, qkv.get_device()),
          op.name(), "cudaDeviceGetAttribute");
    if (major < 8)
      op.value_error(flash ? "the flash attention kernel needs compute capability 8.0+"
                           : "bf16 attention needs compute capability 8.0+");
  }
}

Tensor attention_padded(AttentionKernel kernel, const Tensor& qkv, const OptTensor& mask,
                        int64_t num_heads, double scale, int64_t stream) {
  const bool flash = kernel == AttentionKernel::kFlash;
  Op op = cuda_op(flash ? "flash_attention" : "attention");
  const AttentionArgs a = check_attention(op, qkv, mask, num_heads);
  check_attention_limits(op, qkv, a, kernel);
  Tensor out = empty({a.batch, a.seqlen, a.hidden}, qkv);
  if (out.numel() == 0) return out;
  const uint8_t* mask_ptr = mask ? static_cast<const uint8_t*>(mask->const_data_ptr()) : nullptr;
  run(op, out, [&] {
    const int heads = static_cast<int>(a.num_heads), d = static_cast<int>(a.head_dim);
    if (flash)
      return cuda::launch_flash_attention(out.data_ptr(), qkv.const_data_ptr(), mask_ptr, nullptr,
                                          nullptr, a.batch, a.seqlen, a.tokens, heads, d,
                                          static_cast<float>(scale), a.dtype, stream_of(stream));
    return cuda::launch_attention(out.data_ptr(), qkv.const_data_ptr(), mask_ptr, nullptr, a.batch,
                                  a.seqlen, a.tokens, heads, d, static_cast<float>(scale), a.dtype,
                                  stream_of(stream));
  });
  return out;
}

Tensor attention_packed(AttentionKernel kernel, const Tensor& qkv, const Tensor& cu_seqlens,
                        int64_t max_seqlen, int64_t num_heads, double scale, int64_t stream) {
  const bool flash = kernel == AttentionKernel::kFlash;
  Op op = cuda_op(flash ? "flash_attention_varlen" : "attention_varlen");
  const AttentionArgs a = check_attention_varlen(op, qkv, cu_seqlens, max_seqlen, num_heads);
  check_attention_limits(op, qkv, a, kernel);
  // No sequence: every row is zero. Otherwise the kernel clamps cu_seqlens into
  // [0, T] (its values are not read on the host, so no sync): bounds-safe whatever
  // they hold; the public op has checked that they cover every row.
  if (a.batch == 0 || max_seqlen == 0) {
    Tensor zeros = empty({a.tokens, a.hidden}, qkv);
    return torch::stable::zero_(zeros);
  }
  Tensor out = empty({a.tokens, a.hidden}, qkv);
  if (out.numel() == 0) return out;
  // The flash kernel's tile table, built on the device from cu_seqlens: torch's
  // allocator, on the stream the kernels run on (the current stream, which is
  // what `stream` is), freed for reuse in stream order.
  Tensor scratch;
  if (flash) scratch = empty({cuda::flash_attention_scratch_ints(a.batch, a.tokens)}, cu_seqlens);
  run(op, out, [&] {
    const int heads = static_cast<int>(a.num_heads), d = static_cast<int>(a.head_dim);
    const int32_t* cu = cu_seqlens.const_data_ptr<int32_t>();
    if (flash)
      return cuda::launch_flash_attention(out.data_ptr(), qkv.const_data_ptr(), nullptr, cu,
                                          scratch.mutable_data_ptr<int32_t>(), a.batch, a.seqlen,
                                          a.tokens, heads, d, static_cast<float>(scale), a.dtype,
                                          stream_of(stream));
    return cuda::launch_attention(out.data_ptr(), qkv.const_data_ptr(), nullptr, cu, a.batch,
                                  a.seqlen, a.tokens, heads, d, static_cast<float>(scale), a.dtype,
                                  stream_of(stream));
  });
  return out;
}

Tensor attention(const Tensor& qkv, const OptTensor& mask, int64_t num_heads, double scale,
                 int64_t stream) {
  return attention_padded(AttentionKernel::kDefault, qkv, mask, num_heads, scale, stream);
}

Tensor attention_varlen(const Tensor& qkv, const Tensor& cu_seqlens, int64_t max_seqlen,
                        int64_t num_heads, double scale, int64_t stream) {
  return attention_packed(AttentionKernel::kDefault, qkv, cu_seqlens, max_seqlen, num_heads, scale,
                          stream);
}

Tensor flash_attention(const Tensor& qkv, const OptTensor& mask, int64_t num_heads, double scale,
                       int64_t stream) {
  return attention_padded(AttentionKernel::kFlash, qkv, mask, num_heads, scale, stream);
}

Tensor flash_attention_varlen(const Tensor& qkv, const Tensor& cu_seqlens, int64_t max_seqlen,
                              int64_t num_heads, double scale, int64_t stream) {
  return attention_packed(AttentionKernel::kFlash, qkv, cu_seqlens, max_seqlen, num_heads, scale,
                          stream);
}

Tensor pack_rows(const Tensor& x, const Tensor& indices, int64_t stream) {
  Op op = cuda_op("pack_rows");
  const RowMoveArgs a = check_pack_rows(op, x, indices);
  Tensor out = empty(rows_shape(x, a.num_indices), x);
  if (out.numel() == 0) return out;
  // An index outside [0, x.shape[0]) gives a zero row (no host sync to raise).
  run(op, out, [&] {
    return cuda::launch_pack_rows(out.data_ptr(), x.const_data_ptr(),
                                  indices.const_data_ptr<int64_t>(), a.num_indices, x.size(0),
                                  a.row_bytes, stream_of(stream));
  });
  return out;
}

Tensor unpack_rows(const Tensor& x, const Tensor& indices, int64_t num_rows, int64_t stream) {
  Op op = cuda_op("unpack_rows");
  const RowMoveArgs a = check_unpack_rows(op, x, indices, num_rows);
  Tensor out = empty(rows_shape(x, num_rows), x);
  if (out.numel() == 0) return out;
  // An index outside [0, num_rows) is skipped.
  run(op, out, [&] {
    return cuda::launch_unpack_rows(out.data_ptr(), x.const_data_ptr(),
                                    indices.const_data_ptr<int64_t>(), a.num_indices, num_rows,
                                    a.row_bytes, stream_of(stream));
  });
  return out;
}

}  // namespace

// Number of CUDA devices the runtime sees, or a negative cudaError_t code when
// there is no usable driver/device (so Python can say why, without crashing).
int cuda_device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error state
    return -static_cast<int>(err);
  }
  return n;
}

std::string cuda_error_name(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }

}  // namespace bertfast

// Schemas: the argument names are the Python keywords (bertfast._C.cpu's plus
// `stream`, the cudaStream_t handle as an int).
STABLE_TORCH_LIBRARY(bertfast_cuda, m) {
  // LayerNorm(word[ids] + types[tt] + pos[p]) -> [*ids.shape, E]; a NaN row for an id
  // outside its table.
  m.def(
      "embed_layernorm(Tensor input_ids, Tensor position_ids, Tensor? token_type_ids, "
      "Tensor word, Tensor pos, Tensor? types, Tensor weight, Tensor bias, float eps, "
      "int stream) -> Tensor");
  // LayerNorm((x + bias) + residual) over the last dim.
  m.def(
      "add_layernorm(Tensor x, Tensor residual, Tensor? bias, Tensor weight, Tensor ln_bias, "
      "float eps, int stream) -> Tensor");
  // act(x + bias) over the last dim (gelu, gelu_tanh, relu); inplace writes into x.
  m.def("bias_act(Tensor(a!) x, Tensor? bias, str activation, bool inplace, int stream) -> Tensor");
  // Attention over qkv [B, S, 3H], key mask [B, S] (bool/uint8, optional) -> [B, S, H].
  m.def("attention(Tensor qkv, Tensor? mask, int num_heads, float scale, int stream) -> Tensor");
  // Attention over packed qkv [T, 3H] with cu_seqlens [B + 1] (int32) -> [T, H].
  m.def(
      "attention_varlen(Tensor qkv, Tensor cu_seqlens, int max_seqlen, int num_heads, "
      "float scale, int stream) -> Tensor");
  // attention / attention_varlen on the FlashAttention-2-style kernel (fp16 / bf16, sm_80+).
  m.def(
      "flash_attention(Tensor qkv, Tensor? mask, int num_heads, float scale, int stream) "
      "-> Tensor");
  m.def(
      "flash_attention_varlen(Tensor qkv, Tensor cu_seqlens, int max_seqlen, int num_heads, "
      "float scale, int stream) -> Tensor");
  // x[indices] (an index out of range gives a zero row).
  m.def("pack_rows(Tensor x, Tensor indices, int stream) -> Tensor");
  // out[indices[i]] = x[i], zero rows elsewhere, num_rows rows (an index out of range
  // is skipped).
  m.def("unpack_rows(Tensor x, Tensor indices, int num_rows, int stream) -> Tensor");
}

// CompositeExplicitAutograd: every device reaches the entry point, whose own check
// names the wrong device.
STABLE_TORCH_LIBRARY_IMPL(bertfast_cuda, CompositeExplicitAutograd, m) {
  using namespace bertfast;
  m.impl("embed_layernorm", TORCH_BOX(&embed_layernorm));
  m.impl("add_layernorm", TORCH_BOX(&add_layernorm));
  m.impl("bias_act", TORCH_BOX(&bias_act));
  m.impl("attention", TORCH_BOX(&attention));
  m.impl("attention_varlen", TORCH_BOX(&attention_varlen));
  m.impl("flash_attention", TORCH_BOX(&flash_attention));
  m.impl("flash_attention_varlen", TORCH_BOX(&flash_attention_varlen));
  m.impl("pack_rows", TORCH_BOX(&pack_rows));
  m.impl("unpack_rows", TORCH_BOX(&unpack_rows));
}
