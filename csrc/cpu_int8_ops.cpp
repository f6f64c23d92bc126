// bertfast._C.cpu int8 entry points (torch.ops.bertfast_cpu.*, as in csrc/cpu_ops.cpp)
// (kernels/cpu/qgemm.cpp; formulas in qgemm.h): quantize_rows, qgemm_pack, qgemm_s32 (raw int32
// accumulators, for tests), qlinear (quantize + int8 GEMM + fp32 epilogue, what a quantized model
// runs) and int8_isa. Same discipline as csrc/cpu_ops.cpp: every tensor and size checked
// (csrc/binding.h), ValueError / TypeError naming the op and the argument.
//
// isa: "auto" (AMX, else AVX512-VNNI, else AVX2), "amx", "vnni", "avx2"; None
// reads BERTFAST_CPU_INT8_ISA (default auto) at every call.
#include <torch/csrc/stable/library.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "binding.h"
#include "cpu_int8_ops.h"
#include "registry.h"

#include "cpu/qgemm.h"

namespace bertfast {
namespace {

using namespace binding;

Op int8_op(const char* name) { return Op("cpu", name, DeviceType::CPU); }

// qlinear's outputs from kOutputPoolMin bytes come from a small cache of freed
// output buffers, keyed by exact size (a model's layers ask for the same few sizes
// at every forward). A fresh large allocation is a fresh mapping whose every page
// faults on first touch; on the machines measured that cost as much as the int8
// GEMM itself (a BERT-base forward at 32 x 128: 1.7 s of qlinear -> 0.9 s, 1 thread).
// A freed buffer goes back to the cache while it holds < kOutputPoolMax bytes,
// else to free(). The cache lives for the process (leaked on purpose: tensors may
// outlive static destructors).
constexpr size_t kOutputPoolMin = size_t(1) << 20;
constexpr size_t kOutputPoolMax = size_t(1) << 30;

class OutputPool {
 public:
  // A float32 tensor of `shape` on like's device (the CPU).
  Tensor empty(const Shape& shape, const Tensor& like) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
    if (bytes < kOutputPoolMin) return binding::empty(shape, like, ScalarType::Float);
    void* p = take(bytes);
    if (!p) {
      if (posix_memalign(&p, 64, bytes) != 0) throw std::bad_alloc();
    }
    Shape strides(shape.size(), 1);  // contiguous
    for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
    return torch::stable::from_blob(p, Sizes(shape), Sizes(strides), like.device(),
                                    ScalarType::Float, [this, bytes](void* q) { give(q, bytes); });
  }

 private:
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    cached_ -= bytes;
    return p;
  }
  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= kOutputPoolMax) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

OutputPool& output_pool() {
  static OutputPool* pool = new OutputPool();
  return *pool;
}

// The micro-kernel to run for `isa` (see the file comment).
int resolve_isa(const Op& op, const std::optional<std::string>& isa) {
  const auto [requested, source] = isa_request(isa, "BERTFAST_CPU_INT8_ISA");
  std::string name = requested;
  if (name.empty() || name == "auto") {
    if (cpu::qgemm_cpu_has_amx()) return cpu::kQIsaAmx;
    if (cpu::qgemm_cpu_has_vnni()) return cpu::kQIsaVnni;
    name = "avx2";
  }
  if (name == "amx") {
    if (!cpu::qgemm_cpu_has_amx())
      op.value_error(std::string(source) +
                     "=amx but this CPU (or OS) has no AMX-INT8 (use auto, vnni or avx2)");
    return cpu::kQIsaAmx;
  }
  if (name == "vnni") {
    if (!cpu::qgemm_cpu_has_vnni())
      op.value_error(std::string(source) +
                     "=vnni but this CPU has no AVX512-VNNI (use auto or avx2)");
    return cpu::kQIsaVnni;
  }
  if (name == "avx2") {
#if defined(__x86_64__)
    if (!cpu::qgemm_cpu_has_avx2())
      op.value_error(std::string(source) + "=avx2 but this CPU has no AVX2/FMA");
#endif
    return cpu::kQIsaAvx2;
  }
  op.value_error(std::string(source) + "='" + name + "' is not one of auto, amx, vnni, avx2");
}

void check_k(const Op& op, int64_t K) {
  if (K > cpu::kQMaxK)
    op.value_error("the reduction size K=" + std::to_string(K) + " is above " +
                   std::to_string(cpu::kQMaxK) + " (int32 accumulators would overflow)");
}

// Rows of a [..., K] tensor.
int64_t rows_of(const Tensor& x, int64_t K) {
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  (void)K;
  return M;
}

std::tuple<Tensor, Tensor, Tensor> quantize_rows(const Tensor& x) {
  Op op = int8_op("quantize_rows");
  op.tensor(x, "x", ScalarType::Float);
  op.min_dims(x, "x", 1);
  const int64_t K = x.size(-1);
  const int64_t M = rows_of(x, K);
  Shape rows_shape = shape_of(x);
  rows_shape.pop_back();
  Tensor q = empty(shape_of(x), x, ScalarType::Byte);
  Tensor scale = empty(rows_shape, x);
  Tensor zp = empty(rows_shape, x, ScalarType::Int);
  if (M == 0) return {q, scale, zp};
  cpu::quantize_rows(q.mutable_data_ptr<uint8_t>(), scale.mutable_data_ptr<float>(),
                     zp.mutable_data_ptr<int32_t>(), x.const_data_ptr<float>(), M, K, K, threads());
  return {q, scale, zp};
}

int64_t panels_for(int64_t N) { return (N + cpu::kQPanel - 1) / cpu::kQPanel; }

std::tuple<Tensor, Tensor> qgemm_pack(const Tensor& weight) {
  Op op = int8_op("qgemm_pack");
  op.tensor(weight, "weight", ScalarType::Char);
  op.dims(weight, "weight", 2);
  const int64_t N = weight.size(0), K = weight.size(1);
  check_k(op, K);
  const int64_t P = panels_for(N), K4 = cpu::qgemm_padded_k(K) / 4;
  Tensor packed = empty({P, K4, cpu::kQPanel, 4}, weight);
  Tensor colsum = empty({P * cpu::kQPanel}, weight, ScalarType::Int);
  if (P == 0) return {packed, colsum};
  cpu::qgemm_pack(packed.mutable_data_ptr<int8_t>(), colsum.mutable_data_ptr<int32_t>(),
                  weight.const_data_ptr<int8_t>(), N, K, threads());
  return {packed, colsum};
}

// packed must be qgemm_pack's [ceil(N / 64), ceil(K / 4), 64, 4] for these N, K.
void check_packed(Op& op, const Tensor& packed, int64_t N, int64_t K) {
  op.tensor(packed, "packed", ScalarType::Char);
  op.dims(packed, "packed", 4);
  op.size(packed, "packed", 0, panels_for(N), "64-column panels for out_features");
  op.size(packed, "packed", 1, cpu::qgemm_padded_k(K) / 4, "x's last dimension / 4, rounded up");
  op.size(packed, "packed", 2, cpu::kQPanel, "panel width");
  op.size(packed, "packed", 3, 4, "bytes per 4-k group");
}

void check_out_features(const Op& op, int64_t N) {
  if (N < 0) op.value_error("out_features must be >= 0, got " + std::to_string(N));
}

Shape out_shape(const Tensor& x, int64_t N) {
  Shape shape = shape_of(x);
  shape.back() = N;
  return shape;
}

Tensor qgemm_s32(const Tensor& q, const Tensor& packed, int64_t out_features,
                 const std::optional<std::string>& isa) {
  Op op = int8_op("qgemm_s32");
  check_out_features(op, out_features);
  op.tensor(q, "q", ScalarType::Byte);
  op.dims(q, "q", 2);
  const int64_t M = q.size(0), K = q.size(1), N = out_features;
  check_k(op, K);
  check_packed(op, packed, N, K);
  const int code = resolve_isa(op, isa);
  Tensor out = empty({M, N}, q, ScalarType::Int);
  if (out.numel() == 0) return out;
  const int64_t Kp = cpu::qgemm_padded_k(K);
  Tensor a = q;
  if (Kp != K) {  // the kernel reads rows of Kp bytes: zero-padded copy
    a = empty({M, Kp}, q);
    auto* dst = a.mutable_data_ptr<uint8_t>();
    const auto* src = q.const_data_ptr<uint8_t>();
    for (int64_t m = 0; m < M; ++m) {
      std::memcpy(dst + m * Kp, src + m * K, static_cast<size_t>(K));
      std::memset(dst + m * Kp + K, 0, static_cast<size_t>(Kp - K));
    }
  }
  {
    cpu::qgemm_s32(out.mutable_data_ptr<int32_t>(), a.const_data_ptr<uint8_t>(), Kp,
                   packed.const_data_ptr<int8_t>(), M, N, K, code, threads());
  }
  return out;
}

Tensor qlinear(const Tensor& x, const Tensor& packed, const Tensor& colsum, const Tensor& w_scale,
               const OptTensor& bias, const std::optional<std::string>& activation,
               const std::optional<std::string>& isa, bool split) {
  Op op = int8_op("qlinear");
  op.tensor(x, "x", ScalarType::Float);
  op.min_dims(x, "x", 1);
  op.tensor(w_scale, "w_scale", ScalarType::Float);
  op.dims(w_scale, "w_scale", 1);
  const int64_t K = x.size(-1), M = rows_of(x, K), N = w_scale.size(0);
  check_k(op, K);
  check_packed(op, packed, N, K);
  op.tensor(colsum, "colsum", ScalarType::Int);
  op.dims(colsum, "colsum", 1);
  op.size(colsum, "colsum", 0, panels_for(N) * cpu::kQPanel, "64-column panels for out_features");
  if (bias) {
    op.tensor(*bias, "bias", ScalarType::Float);
    op.dims(*bias, "bias", 1);
    op.size(*bias, "bias", 0, N, "out_features (w_scale's size)");
  }
  const int act = op.activation(activation, /*allow_none=*/true);
  const int code = resolve_isa(op, isa);
  Tensor out = output_pool().empty(out_shape(x, N), x);
  if (out.numel() == 0) return out;
  {
    cpu::qlinear(out.mutable_data_ptr<float>(), x.const_data_ptr<float>(),
                 packed.const_data_ptr<int8_t>(), colsum.const_data_ptr<int32_t>(),
                 w_scale.const_data_ptr<float>(), bias ? bias->const_data_ptr<float>() : nullptr, M,
                 N, K, act, code, threads(), split);
  }
  return out;
}

}  // namespace

Tensor cpu_qlinear(const Tensor& x, const Tensor& packed, const Tensor& colsum,
                   const Tensor& w_scale, const OptTensor& bias,
                   const std::optional<std::string>& activation,
                   const std::optional<std::string>& isa, bool split) {
  return qlinear(x, packed, colsum, w_scale, bias, activation, isa, split);
}

std::string cpu_int8_isa(const std::optional<std::string>& isa) {
  Op op = int8_op("int8_isa");
  const int code = resolve_isa(op, isa);
  return code == cpu::kQIsaAmx ? "amx" : code == cpu::kQIsaVnni ? "vnni" : "avx2";
}

}  // namespace bertfast

STABLE_TORCH_LIBRARY_FRAGMENT(bertfast_cpu, m) {
  // Per-row asymmetric uint8 quantization of fp32 x [..., K] -> (q uint8 [..., K], scale
  // float32 [...], zero_point int32 [...]); a row with NaN/inf gets scale NaN.
  m.def("quantize_rows(Tensor x) -> (Tensor, Tensor, Tensor)");
  // int8 weight [N, K] -> (packed [ceil(N/64), ceil(K/4), 64, 4] int8, column sums
  // [ceil(N/64)*64] int32).
  m.def("qgemm_pack(Tensor weight) -> (Tensor, Tensor)");
  // Raw int32 accumulators q [M, K] (uint8) @ W.T for W packed by qgemm_pack -> [M, N].
  m.def("qgemm_s32(Tensor q, Tensor packed, int out_features, str? isa=None) -> Tensor");
  // act(dequant(quantize_rows(x) @ Wq.T) + bias) in fp32 for W packed by qgemm_pack,
  // w_scale [N] per output channel; split=True: x in two quantized parts (its uint8 rows
  // and what they miss), two int8 GEMMs summed in fp32 (kernels/cpu/qgemm.h).
  m.def(
      "qlinear(Tensor x, Tensor packed, Tensor colsum, Tensor w_scale, Tensor? bias, "
      "str? activation=None, str? isa=None, bool split=False) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(bertfast_cpu, CompositeExplicitAutograd, m) {
  using namespace bertfast;
  m.impl("quantize_rows", TORCH_BOX(&quantize_rows));
  m.impl("qgemm_pack", TORCH_BOX(&qgemm_pack));
  m.impl("qgemm_s32", TORCH_BOX(&qgemm_s32));
  m.impl("qlinear", TORCH_BOX(&qlinear));
}
