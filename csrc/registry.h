// The plain (tensor-free) functions each native backend gives the pybind11 module
// (csrc/module.cpp). The tensor entry points are torch operators instead, registered
// in the backend's own file (csrc/cpu_ops.cpp, csrc/cpu_int8_ops.cpp,
// csrc/cuda/cuda_ops.cpp) through the stable ABI.
#pragma once

#include <optional>
#include <string>

namespace bertfast {
// The int8 micro-kernel a qlinear call with this isa runs: "amx", "vnni" or "avx2"
// (nullopt reads BERTFAST_CPU_INT8_ISA); std::invalid_argument for a name this CPU
// cannot run.
std::string cpu_int8_isa(const std::optional<std::string>& isa);
#ifdef BERTFAST_WITH_CUDA
// Number of CUDA devices the runtime sees, or a negative cudaError_t code when there
// is no usable driver/device (so Python can say why, without crashing).
int cuda_device_count();
std::string cuda_error_name(int code);
#endif
}  // namespace bertfast
