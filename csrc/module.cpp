// bertfast._C: the native kernels, bound through pybind11 (torch's bundled copy,
// the one its at::Tensor caster is written for).
//
// Submodules: _C.cpu (csrc/cpu_ops.cpp) and, when nvcc was found at build time,
// _C.cuda (csrc/cuda/cuda_ops.cpp). Both take torch tensors, check them and raise a
// Python exception naming the op and the argument on any mismatch. Here: what the
// build contains and the constants of kernels/constants.h.
#include <pybind11/pybind11.h>

#include <iterator>

#include "constants.h"
#include "registry.h"

namespace py = pybind11;

#ifndef BERTFAST_CXX_COMPILER
#define BERTFAST_CXX_COMPILER "unknown"
#endif
#ifndef BERTFAST_CUDA_STATUS
#define BERTFAST_CUDA_STATUS "unknown"
#endif

namespace {

py::dict build_info() {
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

template <typename Names>
py::tuple names(const Names& list) {
  py::tuple t(std::size(list));
  for (size_t i = 0; i < std::size(list); ++i) t[i] = py::str(list[i]);
  return t;
}

template <int... V>
py::tuple values(bertfast::IntList<V...>) {
  return py::make_tuple(V...);
}

py::dict constants() {
  using namespace bertfast;
  py::dict c;
  c["dtypes"] = names(kDTypeNames);            // code = index
  c["activations"] = names(kActivationNames);  // code = index
  c["no_activation"] = static_cast<int>(kNoActivation);
  c["cuda_attention_head_dims"] = values(CudaAttentionHeadDims{});
  c["cuda_flash_attention_head_dims"] = values(CudaFlashAttentionHeadDims{});
  c["max_layernorm_width"] = kMaxLayerNormWidth;
  c["max_grid_yz"] = kMaxGridYZ;
  c["max_cuda_seqlen"] = kMaxCudaSeqLen;
  c["max_cuda_rows"] = kMaxCudaRows;
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "bertfast native kernels (C++ CPU and CUDA C++)";
  m.def("build_info", &build_info,
        "What this build contains: C++ compiler, OpenMP, CUDA version and architectures.");
  m.def("constants", &constants,
        "dtype and activation codes, CUDA head dims and size limits (kernels/constants.h)");
  bertfast::register_cpu_ops(m);
  bertfast::register_cpu_int8_ops(m);
#ifdef BERTFAST_WITH_CUDA
  bertfast::register_cuda_ops(m);
#endif
}
