// The int8 linear entry point (csrc/cpu_int8_ops.cpp) for the composites of
// csrc/cpu_ops.cpp (encoder_layer_int8): the same function torch.ops.bertfast_cpu.qlinear
// runs, with its checks.
#pragma once

#include <optional>
#include <string>

#include "binding.h"

namespace bertfast {
binding::Tensor cpu_qlinear(const binding::Tensor& x, const binding::Tensor& packed,
                            const binding::Tensor& colsum, const binding::Tensor& w_scale,
                            const binding::OptTensor& bias,
                            const std::optional<std::string>& activation,
                            const std::optional<std::string>& isa, bool split);
}  // namespace bertfast
