// pybind11 bindings of the CUDA kernels in kernels/cuda/ (compiled only when
// nvcc is found), registered as the submodule bertfast._C.cuda (plus
// bertfast._C.cuda_device_count at top level).
//
// The Python side (bertfast/ops/cuda.py) has already validated shapes, dtypes and
// devices, made the tensors contiguous and allocated the outputs; it passes raw
// device pointers (data_ptr() ints, 0 for an absent optional tensor), sizes, a
// dtype code (kernels/cuda/launchers.cuh), the tensors' device index and the
// current torch stream (cuda_stream int). Each binding makes that device current
// for the duration of the call, enqueues on that stream, and turns any launch
// error into a Python RuntimeError naming the op.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/launchers.cuh"
#include "registry.h"

namespace py = pybind11;

namespace bertfast {

namespace {

[[noreturn]] void raise_cuda_error(const char* op, const char* what, cudaError_t err) {
  throw std::runtime_error(std::string("bertfast.") + op + " (cuda): " + what + " failed: " +
                           cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) raise_cuda_error(op, what, err);
}

// Makes `device` current for its lifetime and restores the previous device.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* op) {
    check(cudaGetDevice(&previous_), op, "cudaGetDevice");
    if (device >= 0 && device != previous_) {
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

template <typename P>
P* ptr(std::uintptr_t address) {
  return reinterpret_cast<P*>(address);
}

cudaStream_t stream_of(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

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

std::string cuda_error_name(int code) {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

void embed_layernorm(std::uintptr_t out, std::uintptr_t input_ids, std::uintptr_t position_ids,
                     std::uintptr_t token_type_ids, std::uintptr_t word, std::uintptr_t pos,
                     std::uintptr_t types, std::uintptr_t weight, std::uintptr_t bias,
                     int64_t rows, int64_t width, int64_t vocab, int64_t max_positions,
                     int64_t type_vocab, double eps, int dtype, int device,
                     std::uintptr_t stream) {
  const char* op = "embed_layernorm";
  DeviceGuard guard(device, op);
  check(cuda::launch_embed_layernorm(ptr<void>(out), ptr<const int64_t>(input_ids),
                                     ptr<const int64_t>(position_ids),
                                     ptr<const int64_t>(token_type_ids), ptr<const void>(word),
                                     ptr<const void>(pos), ptr<const void>(types),
                                     ptr<const void>(weight), ptr<const void>(bias), rows, width,
                                     vocab, max_positions, type_vocab, static_cast<float>(eps),
                                     dtype, stream_of(stream)),
        op, "kernel launch");
}

void add_layernorm(std::uintptr_t out, std::uintptr_t x, std::uintptr_t residual,
                   std::uintptr_t bias, std::uintptr_t weight, std::uintptr_t ln_bias,
                   int64_t rows, int64_t width, double eps, int dtype, int device,
                   std::uintptr_t stream) {
  const char* op = "add_layernorm";
  DeviceGuard guard(device, op);
  check(cuda::launch_add_layernorm(ptr<void>(out), ptr<const void>(x), ptr<const void>(residual),
                                   ptr<const void>(bias), ptr<const void>(weight),
                                   ptr<const void>(ln_bias), rows, width, static_cast<float>(eps),
                                   dtype, stream_of(stream)),
        op, "kernel launch");
}

void bias_act(std::uintptr_t out, std::uintptr_t x, std::uintptr_t bias, int64_t rows,
              int64_t width, int activation, int dtype, int device, std::uintptr_t stream) {
  const char* op = "bias_gelu";
  DeviceGuard guard(device, op);
  check(cuda::launch_bias_act(ptr<void>(out), ptr<const void>(x), ptr<const void>(bias), rows,
                              width, activation, dtype, stream_of(stream)),
        op, "kernel launch");
}

void attention(std::uintptr_t out, std::uintptr_t qkv, std::uintptr_t mask,
               std::uintptr_t cu_seqlens, int64_t batch, int64_t seqlen, int64_t total_tokens,
               int num_heads, int head_dim, double scale, int dtype, int device,
               std::uintptr_t stream) {
  const char* op = cu_seqlens ? "attention_varlen" : "attention";
  DeviceGuard guard(device, op);
  check(cuda::launch_attention(ptr<void>(out), ptr<const void>(qkv), ptr<const uint8_t>(mask),
                               ptr<const int32_t>(cu_seqlens), batch, seqlen, total_tokens,
                               num_heads, head_dim, static_cast<float>(scale), dtype,
                               stream_of(stream)),
        op, "kernel launch");
}

void pack_rows(std::uintptr_t out, std::uintptr_t x, std::uintptr_t indices, int64_t num_indices,
               int64_t num_src_rows, int64_t row_bytes, int device, std::uintptr_t stream) {
  const char* op = "pack_tokens";
  DeviceGuard guard(device, op);
  check(cuda::launch_pack_rows(ptr<void>(out), ptr<const void>(x), ptr<const int64_t>(indices),
                               num_indices, num_src_rows, row_bytes, stream_of(stream)),
        op, "kernel launch");
}

void unpack_rows(std::uintptr_t out, std::uintptr_t x, std::uintptr_t indices,
                 int64_t num_indices, int64_t num_out_rows, int64_t row_bytes, int device,
                 std::uintptr_t stream) {
  const char* op = "unpack_tokens";
  DeviceGuard guard(device, op);
  check(cuda::launch_unpack_rows(ptr<void>(out), ptr<const void>(x), ptr<const int64_t>(indices),
                                 num_indices, num_out_rows, row_bytes, stream_of(stream)),
        op, "kernel launch");
}

}  // namespace

void register_cuda_ops(pybind11::module_& m) {
  using py::arg;
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices visible to bertfast's runtime (negative: -cudaError_t)");
  py::module_ k = m.def_submodule("cuda", "CUDA kernels (kernels/cuda/), raw-pointer bindings");
  k.def("device_count", &cuda_device_count,
        "CUDA devices visible to bertfast's runtime (negative: -cudaError_t)");
  k.def("error_name", &cuda_error_name, "Name of a cudaError_t code", arg("code"));
  k.attr("max_layernorm_width") = cuda::kMaxLayerNormWidth;
  k.def("attention_supports_head_dim", &cuda::attention_supports_head_dim,
        "Whether the CUDA attention kernel is instantiated for this head dim", arg("head_dim"));
  k.def("embed_layernorm", &embed_layernorm, arg("out"), arg("input_ids"), arg("position_ids"),
        arg("token_type_ids"), arg("word"), arg("pos"), arg("types"), arg("weight"), arg("bias"),
        arg("rows"), arg("width"), arg("vocab"), arg("max_positions"), arg("type_vocab"),
        arg("eps"), arg("dtype"), arg("device"), arg("stream"));
  k.def("add_layernorm", &add_layernorm, arg("out"), arg("x"), arg("residual"), arg("bias"),
        arg("weight"), arg("ln_bias"), arg("rows"), arg("width"), arg("eps"), arg("dtype"),
        arg("device"), arg("stream"));
  k.def("bias_act", &bias_act, arg("out"), arg("x"), arg("bias"), arg("rows"), arg("width"),
        arg("activation"), arg("dtype"), arg("device"), arg("stream"));
  k.def("attention", &attention, arg("out"), arg("qkv"), arg("mask"), arg("cu_seqlens"),
        arg("batch"), arg("seqlen"), arg("total_tokens"), arg("num_heads"), arg("head_dim"),
        arg("scale"), arg("dtype"), arg("device"), arg("stream"));
  k.def("pack_rows", &pack_rows, arg("out"), arg("x"), arg("indices"), arg("num_indices"),
        arg("num_src_rows"), arg("row_bytes"), arg("device"), arg("stream"));
  k.def("unpack_rows", &unpack_rows, arg("out"), arg("x"), arg("indices"), arg("num_indices"),
        arg("num_out_rows"), arg("row_bytes"), arg("device"), arg("stream"));
}

}  // namespace bertfast
