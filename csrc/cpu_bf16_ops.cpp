// bertfast._C.cpu bf16 GEMM entry points (torch.ops.bertfast_cpu.*, as in csrc/cpu_ops.cpp)
// (kernels/cpu/bgemm.cpp; formulas and layout in bgemm.h): bgemm_pack, blinear (what a
// bf16 model's few-row linear layers run) and bf16_gemm_isa. Same discipline as
// csrc/cpu_ops.cpp: every tensor and size checked (csrc/binding.h), ValueError /
// TypeError naming the op and the argument.
//
// isa: "auto" (AMX where this process may use AMX-BF16 tiles, else portable), "amx",
// "portable"; None reads BERTFAST_CPU_BF16_ISA (default auto) at every call.
#include <torch/csrc/stable/library.h>

#include "binding.h"
#include "cpu_bf16_ops.h"

#include "cpu/bgemm.h"

namespace bertfast {
namespace {

using namespace binding;

Op bf16_op(const char* name) { return Op("cpu", name, DeviceType::CPU); }

int resolve_isa(const Op& op, const std::optional<std::string>& isa) {
  const auto [name, source] = isa_request(isa, "BERTFAST_CPU_BF16_ISA");
  if (name.empty() || name == "auto")
    return cpu::bgemm_cpu_has_amx() ? cpu::kBIsaAmx : cpu::kBIsaPortable;
  if (name == "amx") {
    if (!cpu::bgemm_cpu_has_amx())
      op.value_error(std::string(source) +
                     "=amx but this CPU (or OS) has no AMX-BF16 (use auto or portable)");
    return cpu::kBIsaAmx;
  }
  if (name == "portable") return cpu::kBIsaPortable;
  op.value_error(std::string(source) + "='" + name + "' is not one of auto, amx, portable");
}

int64_t panels_for(int64_t N) { return (N + cpu::kBPanel - 1) / cpu::kBPanel; }

uint16_t* bits(Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }
const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.const_data_ptr()); }

Tensor bgemm_pack(const Tensor& weight) {
  Op op = bf16_op("bgemm_pack");
  op.tensor(weight, "weight", ScalarType::BFloat16);
  op.dims(weight, "weight", 2);
  const int64_t N = weight.size(0), K = weight.size(1);
  Tensor packed = empty({panels_for(N), cpu::bgemm_padded_k(K) / 2, cpu::kBPanel, 2}, weight);
  if (packed.numel() == 0) return packed;
  cpu::bgemm_pack(bits(packed), bits(weight), N, K, threads());
  return packed;
}

Tensor blinear(const Tensor& x, const Tensor& packed, const OptTensor& bias, int64_t out_features,
               const std::optional<std::string>& activation,
               const std::optional<std::string>& isa) {
  Op op = bf16_op("blinear");
  if (out_features < 0)
    op.value_error("out_features must be >= 0, got " + std::to_string(out_features));
  op.tensor(x, "x", ScalarType::BFloat16);
  op.min_dims(x, "x", 1);
  const int64_t K = x.size(-1), N = out_features;
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  op.tensor(packed, "packed", ScalarType::BFloat16);
  op.dims(packed, "packed", 4);
  op.size(packed, "packed", 0, panels_for(N), "32-column panels for out_features");
  op.size(packed, "packed", 1, cpu::bgemm_padded_k(K) / 2,
          "x's last dimension rounded up to 32, / 2");
  op.size(packed, "packed", 2, cpu::kBPanel, "panel width");
  op.size(packed, "packed", 3, 2, "bf16 per k pair");
  if (bias) {
    op.tensor(*bias, "bias", ScalarType::BFloat16);
    op.dims(*bias, "bias", 1);
    op.size(*bias, "bias", 0, N, "out_features");
  }
  const int act = op.activation(activation, /*allow_none=*/true);
  const int code = resolve_isa(op, isa);
  Shape shape = shape_of(x);
  shape.back() = N;
  Tensor out = empty(shape, x);
  if (out.numel() == 0) return out;
  // K == 0: no products, act(bias) in every row (the portable kernel reads no x then).
  cpu::blinear(bits(out), bits(x), bits(packed), bias ? bits(*bias) : nullptr, M, N, K, act,
               K == 0 ? cpu::kBIsaPortable : code, threads());
  return out;
}

std::string bf16_gemm_isa(const std::optional<std::string>& isa) {
  Op op = bf16_op("bf16_gemm_isa");
  return resolve_isa(op, isa) == cpu::kBIsaAmx ? "amx" : "portable";
}

}  // namespace

Tensor cpu_blinear(const Tensor& x, const Tensor& packed, const OptTensor& bias,
                   int64_t out_features, const std::optional<std::string>& activation) {
  return blinear(x, packed, bias, out_features, activation, std::nullopt);
}

}  // namespace bertfast

STABLE_TORCH_LIBRARY_FRAGMENT(bertfast_cpu, m) {
  // bf16 weight [N, K] -> packed [ceil(N/32), ceil(K/32)*16, 32, 2] bf16 (k pairs).
  m.def("bgemm_pack(Tensor weight) -> Tensor");
  // bf16 act(x @ W.T + bias) for W packed by bgemm_pack: fp32 products and sums, one
  // rounding to bf16; activation None/gelu/gelu_tanh/relu.
  m.def(
      "blinear(Tensor x, Tensor packed, Tensor? bias, int out_features, str? activation=None, "
      "str? isa=None) -> Tensor");
  // The micro-kernel blinear runs for isa (None: BERTFAST_CPU_BF16_ISA): amx or portable.
  m.def("bf16_gemm_isa(str? isa=None) -> str");
}

STABLE_TORCH_LIBRARY_IMPL(bertfast_cpu, CompositeExplicitAutograd, m) {
  using namespace bertfast;
  m.impl("bgemm_pack", TORCH_BOX(&bgemm_pack));
  m.impl("blinear", TORCH_BOX(&blinear));
  m.impl("bf16_gemm_isa", TORCH_BOX(&bf16_gemm_isa));
}
