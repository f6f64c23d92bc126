// The bf16 linear entry point (csrc/cpu_bf16_ops.cpp) for the composites of
// csrc/cpu_ops.cpp (encoder_layer, encoder_forward on bf16 tokens): the same function
// torch.ops.bertfast_cpu.blinear runs (isa from BERTFAST_CPU_BF16_ISA), with its checks.
#pragma once

#include <optional>
#include <string>

#include "binding.h"

namespace bertfast {
binding::Tensor cpu_blinear(const binding::Tensor& x, const binding::Tensor& packed,
                            const binding::OptTensor& bias, int64_t out_features,
                            const std::optional<std::string>& activation);
}  // namespace bertfast
