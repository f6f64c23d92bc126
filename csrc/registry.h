// Entry points that each native backend provides to the pybind11 module.
// csrc/module.cpp defines the module and calls these; each backend keeps its
// bindings in its own file (csrc/cpu_ops.cpp, csrc/cuda/cuda_ops.cpp).
#pragma once
#include <pybind11/pybind11.h>

namespace bertfast {
void register_cpu_ops(pybind11::module_& m);
void register_cpu_int8_ops(pybind11::module_& m);  // after register_cpu_ops
#ifdef BERTFAST_WITH_CUDA
void register_cuda_ops(pybind11::module_& m);
#endif
}  // namespace bertfast
