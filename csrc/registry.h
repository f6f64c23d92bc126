// The plain (tensor-free) functions each native backend gives the pybind11 module
// (csrc/module.cpp). The tensor entry points are torch operators instead, registered
// in the backend's own file (csrc/cpu_ops.cpp, csrc/cpu_int8_ops.cpp,
// csrc/cuda/cuda_ops.cpp) through the stable ABI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bertfast {
// The int8 micro-kernel a qlinear call with this isa runs: "amx", "vnni" or "avx2"
// (nullopt reads BERTFAST_CPU_INT8_ISA); std::invalid_argument for a name this CPU
// cannot run.
std::string cpu_int8_isa(const std::optional<std::string>& isa);

// The step profile (csrc/step_profile.cpp): while on, each innermost step of a
// composite entry point (encoder_forward, encoder_layer and their int8 forms: the
// embeddings, each GEMM, attention, each LayerNorm) adds its wall time to the total
// of its name ("QKV projection", "attention", ...), summed over layers and calls.
struct StepTime {
  std::string name;
  double seconds;
  int64_t calls;
};
bool step_profile_on();
void step_profile_start();                  // clears the totals, turns it on
std::vector<StepTime> step_profile_stop();  // turns it off, returns the totals
void step_profile_record(const std::string& name, double seconds);
#ifdef BERTFAST_WITH_CUDA
// Number of CUDA devices the runtime sees, or a negative cudaError_t code when there
// is no usable driver/device (so Python can say why, without crashing).
int cuda_device_count();
std::string cuda_error_name(int code);
#endif
}  // namespace bertfast
