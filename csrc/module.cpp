// bertfast._C: the native kernels, bound through pybind11.
//
// The module does not link libtorch. The Python wrappers (bertfast/ops/cpu.py,
// bertfast/ops/cuda.py) validate device, dtype, contiguity and shapes, allocate
// outputs with torch and pass raw pointers, sizes and (for CUDA) the stream.
#include <pybind11/pybind11.h>

#include "registry.h"

#ifdef BERTFAST_WITH_OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

#ifndef BERTFAST_CXX_COMPILER
#define BERTFAST_CXX_COMPILER "unknown"
#endif
#ifndef BERTFAST_CUDA_STATUS
#define BERTFAST_CUDA_STATUS "unknown"
#endif

static py::dict build_info() {
  py::dict info;
  info["cxx_compiler"] = BERTFAST_CXX_COMPILER;
  info["cuda_status"] = BERTFAST_CUDA_STATUS;
#ifdef BERTFAST_WITH_OPENMP
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
#ifdef BERTFAST_WITH_CUDA
  info["cuda"] = true;
  info["cuda_version"] = BERTFAST_CUDA_VERSION;
  info["cuda_archs"] = BERTFAST_CUDA_ARCHS;
#else
  info["cuda"] = false;
  info["cuda_version"] = py::none();
  info["cuda_archs"] = "";
#endif
  return info;
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "bertfast native kernels (C++ CPU and CUDA C++)";
  m.def("build_info", &build_info,
        "What this build contains: C++ compiler, OpenMP, CUDA version and architectures.");
  bertfast::register_cpu_ops(m);
#ifdef BERTFAST_WITH_CUDA
  bertfast::register_cuda_ops(m);
#endif
}
